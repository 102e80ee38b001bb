// Prometheus metrics with vLLM's names and types, so dashboards and autoscalers built for vLLM
// read atom unchanged. Thread-safe; rendered in the Prometheus text format.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace atom::server {

class Metrics {
 public:
  explicit Metrics(std::string model_name);

  // Gauges, set from engine state.
  void set_running(int n);
  void set_waiting(int n);
  void set_kv_cache_usage(double fraction);
  // Recurrent-state slots in use (atom:state_slot_usage_perc; 0 for models without any).
  void set_state_slot_usage(double fraction);

  // Counters.
  void add_prompt_tokens(int64_t n);
  void add_generation_tokens(int64_t n);
  // Engine totals (counters the engine keeps).
  void set_prefix_cache(int64_t queried_tokens, int64_t hit_tokens);
  void set_preemptions(int64_t total);
  // Engine steps that ran a batch, their wall seconds and the host's part of them
  // (atom:engine_steps, atom:engine_step_seconds, atom:engine_step_host_seconds).
  void set_engine_steps(int64_t steps, double seconds, double host_seconds);
  // Speculative decoding totals (vllm:spec_decode_*); rendered once accepted_per_position is set
  // (one entry per draft position).
  void set_spec_decode(int64_t num_drafts, int64_t num_draft_tokens, int64_t num_accepted_tokens,
                       const std::vector<int64_t>& accepted_per_position);
  void add_request_success(const std::string& finished_reason);  // stop | length | abort | error
  void add_http_request(const std::string& handler, const std::string& method, int status);

  // Histograms (seconds unless noted).
  void observe_ttft(double s);
  void observe_inter_token_latency(double s);
  void observe_tpot(double s);  // one observation per request: its mean time per output token
  void observe_e2e_latency(double s);
  void observe_queue_time(double s);
  void observe_prefill_time(double s);
  void observe_decode_time(double s);
  void observe_inference_time(double s);
  void observe_request_tokens(int64_t prompt_tokens, int64_t generation_tokens, int n,
                              int64_t max_tokens);

  // Info-style gauge vllm:cache_config_info.
  void set_cache_config(const std::map<std::string, std::string>& labels);

  std::string render() const;

 private:
  struct Histogram {
    std::vector<double> buckets;   // upper bounds
    std::vector<uint64_t> counts;  // per bucket (not cumulative)
    uint64_t count = 0;
    double sum = 0;
    void observe(double v);
  };

  std::string model_;
  mutable std::mutex mu_;
  int running_ = 0, waiting_ = 0;
  double kv_usage_ = 0, state_usage_ = 0;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0, prefix_queries_ = 0, prefix_hits_ = 0,
          preemptions_ = 0;
  int64_t spec_drafts_ = 0, spec_draft_tokens_ = 0, spec_accepted_ = 0;
  int64_t engine_steps_ = 0;
  double engine_step_s_ = 0, engine_step_host_s_ = 0;
  std::vector<int64_t> spec_per_pos_;
  std::map<std::string, int64_t> success_;
  std::map<std::string, int64_t> http_;  // "handler\tmethod\tstatus"
  Histogram ttft_, itl_, tpot_, e2e_, queue_, prefill_, decode_, inference_, prompt_len_, gen_len_,
      params_n_, params_max_tokens_;
  std::map<std::string, std::string> cache_config_;
};

}  // namespace atom::server
