// `atom bench serve`: a load generator with vLLM's bench-serve conventions. Random-token prompts
// go to /v1/completions (as token ids) or /v1/chat/completions, streamed; arrivals are Poisson at
// --request-rate (gamma with --burstiness), capped by --max-concurrency. It reports TTFT, TPOT,
// ITL and E2EL (mean, median, std, percentiles) and throughputs, and writes a JSON result file.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace atom::server {

struct BenchServeOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string endpoint = "/v1/completions";
  std::string model;  // empty: the first of GET /v1/models
  std::string api_key;
  int num_prompts = 1000;
  int random_input_len = 1024;
  int random_output_len = 128;
  double random_range_ratio = 0.0;
  int random_prefix_len = 0;  // a shared prefix (the same ids) in front of every prompt
  int64_t vocab_size = 0;     // 0: from the server's /v1/models, else 32000
  double request_rate = 0;    // requests/s; 0 or less = all at once (inf)
  double burstiness = 1.0;
  int max_concurrency = 0;  // 0: unlimited
  uint64_t seed = 0;
  bool ignore_eos = true;
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl"};
  std::vector<double> metric_percentiles = {99};
  std::string result_file;  // empty: no file
};

struct RequestRecord {
  bool success = false;
  std::string error;
  int prompt_len = 0;
  int output_tokens = 0;
  double ttft = 0;          // seconds
  double latency = 0;       // seconds (E2EL)
  std::vector<double> itl;  // seconds between streamed outputs
  std::string generated_text;
};

// An atom server's engine-step totals (its /metrics counters).
struct EngineStepTotals {
  double steps = 0, seconds = 0, host_seconds = 0;
};

// Runs the benchmark; returns the result object (also printed as vLLM's table), with the
// server's engine steps over the run (server_engine_steps, server_mean_step_ms,
// server_mean_step_host_ms) when the server reports them.
nlohmann::ordered_json bench_serve_run(const BenchServeOptions& o);

// Mean, median, std and the given percentiles (ms) of `values` (seconds), with vLLM's key names.
void bench_stats_add(nlohmann::ordered_json& result, const std::string& metric,
                     std::vector<double> seconds, const std::vector<double>& percentiles);

}  // namespace atom::server
