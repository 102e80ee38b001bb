#include "server/metrics.h"

#include <fmt/format.h>

namespace atom::server {

namespace {
// vLLM's buckets (vllm/v1/metrics/loggers.py).
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                          0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                          20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kTokenLatencyBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                                  0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                                  7.5,  10.0,  20.0, 40.0,  80.0};
const std::vector<double> kRequestLatencyBuckets = {
    0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
std::vector<double> length_buckets() {
  std::vector<double> b;
  for (double x = 1; x <= 1e6; x *= 10) {
    b.push_back(x);
    b.push_back(2 * x);
    b.push_back(5 * x);
  }
  return b;
}
const std::vector<double> kNBuckets = {1, 2, 5, 10, 20};

std::string fmt_double(double v) { return fmt::format("{}", v); }
}  // namespace

void Metrics::Histogram::observe(double v) {
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (v <= buckets[i]) {
      ++counts[i];
      break;
    }
  }
  ++count;
  sum += v;
}

Metrics::Metrics(std::string model_name) : model_(std::move(model_name)) {
  auto init = [](Histogram& h, const std::vector<double>& b) {
    h.buckets = b;
    h.counts.assign(b.size(), 0);
  };
  init(ttft_, kTtftBuckets);
  init(itl_, kTokenLatencyBuckets);
  init(tpot_, kTokenLatencyBuckets);
  init(e2e_, kRequestLatencyBuckets);
  init(queue_, kRequestLatencyBuckets);
  init(prefill_, kRequestLatencyBuckets);
  init(decode_, kRequestLatencyBuckets);
  init(inference_, kRequestLatencyBuckets);
  init(prompt_len_, length_buckets());
  init(gen_len_, length_buckets());
  init(params_n_, kNBuckets);
  init(params_max_tokens_, length_buckets());
}

#define ATOM_LOCKED std::lock_guard<std::mutex> lock(mu_)
void Metrics::set_running(int n) {
  ATOM_LOCKED;
  running_ = n;
}
void Metrics::set_waiting(int n) {
  ATOM_LOCKED;
  waiting_ = n;
}
void Metrics::set_kv_cache_usage(double f) {
  ATOM_LOCKED;
  kv_usage_ = f;
}
void Metrics::set_state_slot_usage(double f) {
  ATOM_LOCKED;
  state_usage_ = f;
}
void Metrics::add_prompt_tokens(int64_t n) {
  ATOM_LOCKED;
  prompt_tokens_ += n;
}
void Metrics::add_generation_tokens(int64_t n) {
  ATOM_LOCKED;
  generation_tokens_ += n;
}
void Metrics::set_spec_decode(int64_t num_drafts, int64_t num_draft_tokens,
                              int64_t num_accepted_tokens,
                              const std::vector<int64_t>& accepted_per_position) {
  ATOM_LOCKED;
  spec_drafts_ = num_drafts;
  spec_draft_tokens_ = num_draft_tokens;
  spec_accepted_ = num_accepted_tokens;
  spec_per_pos_ = accepted_per_position;
}
void Metrics::set_prefix_cache(int64_t q, int64_t h) {
  ATOM_LOCKED;
  prefix_queries_ = q;
  prefix_hits_ = h;
}
void Metrics::set_preemptions(int64_t total) {
  ATOM_LOCKED;
  preemptions_ = total;
}
void Metrics::set_engine_steps(int64_t steps, double seconds, double host_seconds) {
  ATOM_LOCKED;
  engine_steps_ = steps;
  engine_step_s_ = seconds;
  engine_step_host_s_ = host_seconds;
}
void Metrics::add_request_success(const std::string& r) {
  ATOM_LOCKED;
  ++success_[r];
}
void Metrics::add_http_request(const std::string& handler, const std::string& method, int status) {
  ATOM_LOCKED;
  ++http_[handler + "\t" + method + "\t" + std::to_string(status / 100) + "xx"];
}
void Metrics::observe_ttft(double s) {
  ATOM_LOCKED;
  ttft_.observe(s);
}
void Metrics::observe_inter_token_latency(double s) {
  ATOM_LOCKED;
  itl_.observe(s);
}
void Metrics::observe_tpot(double s) {
  ATOM_LOCKED;
  tpot_.observe(s);
}
void Metrics::observe_e2e_latency(double s) {
  ATOM_LOCKED;
  e2e_.observe(s);
}
void Metrics::observe_queue_time(double s) {
  ATOM_LOCKED;
  queue_.observe(s);
}
void Metrics::observe_prefill_time(double s) {
  ATOM_LOCKED;
  prefill_.observe(s);
}
void Metrics::observe_decode_time(double s) {
  ATOM_LOCKED;
  decode_.observe(s);
}
void Metrics::observe_inference_time(double s) {
  ATOM_LOCKED;
  inference_.observe(s);
}
void Metrics::observe_request_tokens(int64_t p, int64_t g, int n, int64_t max_tokens) {
  ATOM_LOCKED;
  prompt_len_.observe(static_cast<double>(p));
  gen_len_.observe(static_cast<double>(g));
  params_n_.observe(n);
  params_max_tokens_.observe(static_cast<double>(max_tokens));
}
void Metrics::set_cache_config(const std::map<std::string, std::string>& labels) {
  ATOM_LOCKED;
  cache_config_ = labels;
}
#undef ATOM_LOCKED

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string base = fmt::format("engine=\"0\",model_name=\"{}\"", model_);
  std::string o;
  auto gauge = [&](const char* name, const char* help, double v) {
    o += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{}{{{}}} {}\n", name, help, name, name, base,
                     fmt_double(v));
  };
  auto counter = [&](const char* name, const char* help, int64_t v) {
    o += fmt::format("# HELP {}_total {}\n# TYPE {}_total counter\n{}_total{{{}}} {}\n", name, help,
                     name, name, base, v);
  };
  auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    o += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i < h.buckets.size(); ++i) {
      cum += h.counts[i];
      o += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, base, fmt_double(h.buckets[i]), cum);
    }
    o += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, base, h.count);
    o += fmt::format("{}_count{{{}}} {}\n{}_sum{{{}}} {}\n", name, base, h.count, name, base,
                     fmt_double(h.sum));
  };
  gauge("vllm:num_requests_running", "Number of requests in model execution batches.", running_);
  gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting_);
  gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv_usage_);
  gauge("atom:state_slot_usage_perc", "Recurrent-state slot usage. 1 means 100 percent usage.",
        state_usage_);
  counter("vllm:prompt_tokens", "Number of prefill tokens processed.", prompt_tokens_);
  counter("vllm:generation_tokens", "Number of generation tokens processed.", generation_tokens_);
  counter("vllm:prefix_cache_queries",
          "Prefix cache queries, in terms of number of queried tokens.", prefix_queries_);
  counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
          prefix_hits_);
  counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", preemptions_);
  counter("atom:engine_steps", "Engine steps that ran a batch.", engine_steps_);
  auto counter_f = [&](const char* name, const char* help, double v) {
    o += fmt::format("# HELP {}_total {}\n# TYPE {}_total counter\n{}_total{{{}}} {:.9g}\n", name,
                     help, name, name, base, v);
  };
  counter_f("atom:engine_step_seconds", "Wall time of the engine steps that ran a batch.",
            engine_step_s_);
  counter_f("atom:engine_step_host_seconds",
            "Of it, the host's own (scheduling, batch building, outputs): all but the forward "
            "with sampling.",
            engine_step_host_s_);
  if (!spec_per_pos_.empty()) {
    counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", spec_drafts_);
    counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", spec_draft_tokens_);
    counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", spec_accepted_);
    o += "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft "
         "position.\n# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n";
    for (size_t i = 0; i < spec_per_pos_.size(); ++i)
      o += fmt::format(
          "vllm:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n", base, i,
          spec_per_pos_[i]);
  }
  o += "# HELP vllm:request_success_total Count of successfully processed requests.\n"
       "# TYPE vllm:request_success_total counter\n";
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    auto it = success_.find(reason);
    o += fmt::format("vllm:request_success_total{{{},finished_reason=\"{}\"}} {}\n", base, reason,
                     it == success_.end() ? 0 : it->second);
  }
  histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            ttft_);
  histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            itl_);
  histogram("vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.", tpot_);
  histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
            e2e_);
  histogram("vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.", queue_);
  histogram("vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.", prefill_);
  histogram("vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.", decode_);
  histogram("vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.", inference_);
  histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", prompt_len_);
  histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", gen_len_);
  histogram("vllm:request_params_n", "Histogram of the n request parameter.", params_n_);
  histogram("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
            params_max_tokens_);
  if (!cache_config_.empty()) {
    std::string labels = base;
    for (const auto& [k, v] : cache_config_) labels += fmt::format(",{}=\"{}\"", k, v);
    o += fmt::format("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                     "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{{}}} 1.0\n",
                     labels);
  }
  o += "# HELP http_requests_total Total number of requests by method, status and handler.\n"
       "# TYPE http_requests_total counter\n";
  for (const auto& [key, v] : http_) {
    const size_t a = key.find('\t'), b = key.find('\t', a + 1);
    o += fmt::format("http_requests_total{{handler=\"{}\",method=\"{}\",status=\"{}\"}} {}\n",
                     key.substr(0, a), key.substr(a + 1, b - a - 1), key.substr(b + 1), v);
  }
  return o;
}

}  // namespace atom::server
