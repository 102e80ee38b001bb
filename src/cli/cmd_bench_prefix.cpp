// atom bench prefix --model DIR --prefix-len 2000 --suffix-len 16 --num-iters 5
//
// What the prefix cache does to time to first token. Each iteration draws a fresh random prefix,
// runs one request of prefix + suffix A alone (nothing cached: a cold prefill), then one of
// prefix + suffix B (the prefix's full blocks come from the cache), and records both TTFTs.
// Warm-up iterations first, untimed, so that first-use costs (GEMM plans for these shapes,
// allocator growth) land outside the timed ones.
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>

#include "cli/bench_command.h"
#include "cli/bench_util.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/engine_args.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/llm_engine.h"

namespace {

using atom::cli::mean;
using atom::cli::percentile;

struct PrefixArgs {
  atom::cli::ModelArgs model;
  atom::cli::EngineArgs engine;
  int prefix_len = 2000, suffix_len = 16, output_len = 1;
  int num_iters = 5, num_iters_warmup = 1;
  std::string output_json;
};

void run_prefix(const PrefixArgs& a) {
  if (a.prefix_len < 1) atom::fail("--prefix-len must be at least 1, got {}", a.prefix_len);
  if (a.suffix_len < 1) atom::fail("--suffix-len must be at least 1, got {}", a.suffix_len);
  if (a.output_len < 1) atom::fail("--output-len must be at least 1, got {}", a.output_len);
  if (a.num_iters < 1) atom::fail("--num-iters must be at least 1, got {}", a.num_iters);
  auto m = atom::cli::model_args_load(a.model);
  if (atom::cli::worker_ran(*m)) return;
  const atom::EngineConfig config = atom::cli::engine_args_config(a.engine);
  if (!config.enable_prefix_caching)
    atom::log_warn("prefix caching is off: the second request recomputes the prefix too");
  atom::LLMEngine engine(*m, config);
  const int64_t V = m->model().vocab_size();
  const atom::SamplingParams params = atom::cli::bench_params(a.output_len);
  std::mt19937_64 rng(config.seed);
  std::vector<double> cold, warm;
  int cached = 0;
  auto ttft_of = [&](const std::vector<int32_t>& prefix, int* hit) {
    std::vector<int32_t> prompt = prefix;
    const auto suffix = atom::cli::random_tokens(rng, a.suffix_len, V);
    prompt.insert(prompt.end(), suffix.begin(), suffix.end());
    const auto out = engine.generate({prompt}, params).at(0).outputs.at(0);
    if (hit) *hit = out.num_cached_tokens;
    return out.ttft * 1e3;
  };
  for (int i = 0; i < a.num_iters_warmup + a.num_iters; ++i) {
    const auto prefix = atom::cli::random_tokens(rng, a.prefix_len, V);
    int cold_hit = 0;
    const double c = ttft_of(prefix, &cold_hit);
    const double w = ttft_of(prefix, &cached);
    if (cold_hit > 0) atom::fail("the cold request hit the cache ({} tokens)", cold_hit);
    if (i < a.num_iters_warmup) continue;
    cold.push_back(c);
    warm.push_back(w);
  }
  const int prompt_len = a.prefix_len + a.suffix_len;
  const double speedup = mean(warm) > 0 ? mean(cold) / mean(warm) : 0.0;
  std::printf("Cold TTFT (%d-token prompt, nothing cached): mean %.2f ms, median %.2f ms\n",
              prompt_len, mean(cold), percentile(cold, 50));
  std::printf(
      "Warm TTFT (%d of %d prompt tokens from the prefix cache): mean %.2f ms, median %.2f ms\n",
      cached, prompt_len, mean(warm), percentile(warm, 50));
  std::printf("Prefix cache TTFT speedup: %.2fx\n", speedup);
  atom::cli::write_json(a.output_json, {{"prefix_len", a.prefix_len},
                                        {"suffix_len", a.suffix_len},
                                        {"cached_tokens", cached},
                                        {"cold_ttft_ms", cold},
                                        {"warm_ttft_ms", warm},
                                        {"mean_cold_ttft_ms", mean(cold)},
                                        {"mean_warm_ttft_ms", mean(warm)},
                                        {"median_cold_ttft_ms", percentile(cold, 50)},
                                        {"median_warm_ttft_ms", percentile(warm, 50)},
                                        {"ttft_speedup", speedup}});
}

}  // namespace

ATOM_REGISTER_COMMAND([](CLI::App& app) {
  CLI::App* bench = atom::cli::bench_command(app);
  auto a = std::make_shared<PrefixArgs>();
  auto* cmd = bench->add_subcommand(
      "prefix", "Time to first token with and without a cached shared prompt prefix");
  atom::cli::model_args_add(cmd, a->model);
  atom::cli::engine_args_add(cmd, a->engine);
  cmd->add_option("--prefix-len", a->prefix_len, "tokens the two prompts share")
      ->capture_default_str();
  cmd->add_option("--suffix-len", a->suffix_len, "tokens after the prefix, different in each")
      ->capture_default_str();
  cmd->add_option("--output-len", a->output_len, "generated tokens per request")
      ->capture_default_str();
  cmd->add_option("--num-iters", a->num_iters, "timed (cold, warm) pairs")->capture_default_str();
  cmd->add_option("--num-iters-warmup", a->num_iters_warmup, "untimed pairs first")
      ->capture_default_str();
  cmd->add_option("--output-json", a->output_json, "also write the results to this JSON file");
  cmd->callback([a] { run_prefix(*a); });
});
