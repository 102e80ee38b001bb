// atom bench serve: load-tests a running OpenAI-compatible server (atom's or anyone's) with vLLM's
// bench-serve conventions.
#include "cli/bench_command.h"
#include "cli/command.h"
#include "server/bench_serve.h"

ATOM_REGISTER_COMMAND([](CLI::App& app) {
  auto o = std::make_shared<atom::server::BenchServeOptions>();
  auto* cmd = atom::cli::bench_command(app)->add_subcommand(
      "serve",
      "Load-test a running server (like vllm bench serve): TTFT, TPOT, ITL, E2EL, throughput");
  cmd->add_option("--host", o->host)->capture_default_str();
  cmd->add_option("--port", o->port)->capture_default_str();
  cmd->add_option("--endpoint", o->endpoint, "/v1/completions or /v1/chat/completions")
      ->capture_default_str();
  cmd->add_option("--model", o->model, "model name to send (default: the server's first)");
  cmd->add_option("--api-key", o->api_key);
  cmd->add_option(
      "--dataset-name",
      [](const std::vector<std::string>& v) {
        if (v.at(0) != "random")
          throw CLI::ValidationError("--dataset-name", "only 'random' is available");
        return true;
      },
      "random (random token prompts)");
  cmd->add_option("--num-prompts", o->num_prompts)->capture_default_str();
  cmd->add_option("--random-input-len", o->random_input_len)->capture_default_str();
  cmd->add_option("--random-output-len", o->random_output_len)->capture_default_str();
  cmd->add_option("--random-range-ratio", o->random_range_ratio)->capture_default_str();
  cmd->add_option("--random-prefix-len", o->random_prefix_len, "tokens shared by every prompt")
      ->capture_default_str();
  cmd->add_option("--vocab-size", o->vocab_size,
                  "token ids are drawn below this (default: from /v1/models)");
  cmd->add_option("--request-rate", o->request_rate, "requests/s, Poisson arrivals (default inf)");
  cmd->add_option("--burstiness", o->burstiness, "gamma shape of the arrivals (1: Poisson)")
      ->capture_default_str();
  cmd->add_option("--max-concurrency", o->max_concurrency,
                  "requests in flight at most (default unlimited)");
  cmd->add_option("--seed", o->seed)->capture_default_str();
  cmd->add_flag("--ignore-eos,!--no-ignore-eos", o->ignore_eos,
                "generate exactly the output length");
  cmd->add_option(
      "--percentile-metrics",
      [o](const std::vector<std::string>& v) {
        o->percentile_metrics.clear();
        for (const auto& s : v) {
          size_t pos = 0;
          while (pos <= s.size()) {
            const size_t c = s.find(',', pos);
            o->percentile_metrics.push_back(
                s.substr(pos, c == std::string::npos ? std::string::npos : c - pos));
            if (c == std::string::npos) break;
            pos = c + 1;
          }
        }
        return true;
      },
      "ttft,tpot,itl,e2el");
  cmd->add_option(
      "--metric-percentiles",
      [o](const std::vector<std::string>& v) {
        o->metric_percentiles.clear();
        for (const auto& s : v) {
          size_t pos = 0;
          while (pos <= s.size()) {
            const size_t c = s.find(',', pos);
            o->metric_percentiles.push_back(
                std::stod(s.substr(pos, c == std::string::npos ? std::string::npos : c - pos)));
            if (c == std::string::npos) break;
            pos = c + 1;
          }
        }
        return true;
      },
      "e.g. 50,90,99");
  cmd->add_option("--result-filename", o->result_file, "write the JSON result here");
  cmd->add_flag(
      "--save-result",
      [o](int64_t) {
        if (o->result_file.empty()) o->result_file = "atom-bench-serve.json";
      },
      "write the JSON result (atom-bench-serve.json unless --result-filename)");
  cmd->callback([o] { atom::server::bench_serve_run(*o); });
});
