// atom bench throughput --model DIR --input-len 1000 --output-len 1000 --num-prompts 512
// atom bench latency    --model DIR --input-len 32 --output-len 128 --batch-size 8
//
// Offline benchmarks shaped like `vllm bench throughput` and `vllm bench latency`: random token
// prompts, temperature 1, top_p 1, ignore_eos, timed through LLMEngine::generate. Both print what
// vLLM prints and write the same keys with --output-json (plus TTFT/TPOT and cache statistics).
// As in vLLM, the latency benchmark reuses one batch of prompts for every iteration, so with
// prefix caching on the iterations after the first are served from the cache; compare against
// --no-enable-prefix-caching to see what the cache saves (TTFT).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/bench_command.h"
#include "cli/bench_util.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/engine_args.h"
#include "core/error.h"
#include "engine/llm_engine.h"

namespace {

using atom::cli::bench_params;
using atom::cli::mean;
using atom::cli::percentile;
using atom::cli::random_tokens;
using atom::cli::write_json;
using nlohmann::json;
using Prompts = std::vector<std::vector<int32_t>>;

struct BenchArgs {
  atom::cli::ModelArgs model;
  atom::cli::EngineArgs engine;
  int input_len = 1024, output_len = 128;
  int prefix_len = 0;  // throughput: tokens every prompt shares at its start
  int num_prompts = 1000;
  int batch_size = 8, num_iters = 30, num_iters_warmup = 10;
  std::string output_json;
};

// Random prompts; the first prefix_len tokens are the same in every prompt.
Prompts random_prompts(int count, int len, int prefix_len, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<int32_t> prefix = random_tokens(rng, std::min(prefix_len, len), vocab);
  Prompts r(static_cast<size_t>(count));
  for (auto& p : r) {
    p = prefix;
    const auto rest = random_tokens(rng, len - static_cast<int>(prefix.size()), vocab);
    p.insert(p.end(), rest.begin(), rest.end());
  }
  return r;
}

void check_lengths(const BenchArgs& a) {
  if (a.input_len < 1) atom::fail("--input-len must be at least 1, got {}", a.input_len);
  if (a.output_len < 1) atom::fail("--output-len must be at least 1, got {}", a.output_len);
}

void run_throughput(const BenchArgs& a) {
  check_lengths(a);
  if (a.num_prompts < 1) atom::fail("--num-prompts must be at least 1, got {}", a.num_prompts);
  auto m = atom::cli::model_args_load(a.model);
  if (atom::cli::worker_ran(*m)) return;
  const atom::EngineConfig config = atom::cli::engine_args_config(a.engine);
  const auto drafter = atom::cli::model_args_load_drafter(a.model, *m, config);
  atom::LLMEngine engine(*m, config, {}, {}, atom::cli::drafter_of(drafter));
  const Prompts prompts = random_prompts(a.num_prompts, a.input_len, a.prefix_len,
                                         m->model().vocab_size(), config.seed);
  const auto t0 = std::chrono::steady_clock::now();
  const auto outs = engine.generate(prompts, bench_params(a.output_len));
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int64_t prompt_tokens = 0, output_tokens = 0;
  std::vector<double> ttft, tpot;
  for (const auto& o : outs) {
    prompt_tokens += static_cast<int64_t>(o.prompt_token_ids.size());
    for (const auto& c : o.outputs) {
      output_tokens += static_cast<int64_t>(c.token_ids.size());
      ttft.push_back(c.ttft * 1e3);
      if (c.token_ids.size() > 1) tpot.push_back(c.tpot * 1e3);
    }
  }
  const int64_t total = prompt_tokens + output_tokens;
  const auto st = engine.stats();
  std::printf("Throughput: %.2f requests/s, %.2f total tokens/s, %.2f output tokens/s\n",
              static_cast<double>(outs.size()) / elapsed, static_cast<double>(total) / elapsed,
              static_cast<double>(output_tokens) / elapsed);
  std::printf("Total num prompt tokens:  %lld\n", static_cast<long long>(prompt_tokens));
  std::printf("Total num output tokens:  %lld\n", static_cast<long long>(output_tokens));
  std::printf(
      "TTFT ms: mean %.2f, median %.2f, p99 %.2f | TPOT ms: mean %.2f, median %.2f, p99 %.2f\n",
      mean(ttft), percentile(ttft, 50), percentile(ttft, 99), mean(tpot), percentile(tpot, 50),
      percentile(tpot, 99));
  const double hit_rate = st.prefix_cache_queries
                              ? static_cast<double>(st.prefix_cache_hits) / st.prefix_cache_queries
                              : 0.0;
  std::printf("Engine: %lld steps, %lld preemptions, prefix cache hit rate %.1f%%\n",
              static_cast<long long>(st.num_steps), static_cast<long long>(st.num_preemptions),
              100.0 * hit_rate);
  // Per step: the whole step, and the host's own part (all but the forward with sampling).
  const double steps = static_cast<double>(std::max<int64_t>(st.num_steps, 1));
  const double step_ms = 1e3 * st.step_seconds / steps,
               host_ms = 1e3 * (st.step_seconds - st.forward_seconds) / steps;
  std::printf("Engine step: mean %.3f ms, of which host %.3f ms (%.1f%%: scheduling, batch, "
              "outputs)\n",
              step_ms, host_ms, st.step_seconds > 0 ? 100.0 * host_ms / step_ms : 0.0);
  const double acceptance_length =
      st.spec_num_drafts
          ? 1.0 + static_cast<double>(st.spec_num_accepted_tokens) / st.spec_num_drafts
          : 1.0;
  if (engine.speculative())
    std::printf(
        "Speculative decoding: %s\n",
        atom::spec_decode_stats_line(st.spec_num_drafts, st.spec_num_draft_tokens,
                                     st.spec_num_accepted_tokens, st.spec_accepted_per_position)
            .c_str());
  write_json(a.output_json,
             {{"elapsed_time", elapsed},
              {"num_requests", outs.size()},
              {"total_num_tokens", total},
              {"requests_per_second", static_cast<double>(outs.size()) / elapsed},
              {"tokens_per_second", static_cast<double>(total) / elapsed},
              {"output_tokens_per_second", static_cast<double>(output_tokens) / elapsed},
              {"total_prompt_tokens", prompt_tokens},
              {"total_output_tokens", output_tokens},
              {"mean_ttft_ms", mean(ttft)},
              {"median_ttft_ms", percentile(ttft, 50)},
              {"p99_ttft_ms", percentile(ttft, 99)},
              {"mean_tpot_ms", mean(tpot)},
              {"median_tpot_ms", percentile(tpot, 50)},
              {"p99_tpot_ms", percentile(tpot, 99)},
              {"num_steps", st.num_steps},
              {"num_preemptions", st.num_preemptions},
              {"mean_step_ms", step_ms},
              {"mean_step_host_ms", host_ms},
              {"prefix_cache_hit_rate", hit_rate},
              {"spec_decode_num_drafts", st.spec_num_drafts},
              {"spec_decode_num_draft_tokens", st.spec_num_draft_tokens},
              {"spec_decode_num_accepted_tokens", st.spec_num_accepted_tokens},
              {"spec_decode_mean_acceptance_length", acceptance_length}});
}

void run_latency(const BenchArgs& a) {
  check_lengths(a);
  if (a.batch_size < 1) atom::fail("--batch-size must be at least 1, got {}", a.batch_size);
  if (a.num_iters < 1) atom::fail("--num-iters must be at least 1, got {}", a.num_iters);
  auto m = atom::cli::model_args_load(a.model);
  if (atom::cli::worker_ran(*m)) return;
  const atom::EngineConfig config = atom::cli::engine_args_config(a.engine);
  const auto drafter = atom::cli::model_args_load_drafter(a.model, *m, config);
  atom::LLMEngine engine(*m, config, {}, {}, atom::cli::drafter_of(drafter));
  const Prompts prompts =
      random_prompts(a.batch_size, a.input_len, 0, m->model().vocab_size(), config.seed);
  const atom::SamplingParams params = bench_params(a.output_len);
  auto run_once = [&](std::vector<double>* ttft) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto outs = engine.generate(prompts, params);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (ttft)
      for (const auto& o : outs) ttft->push_back(o.outputs.at(0).ttft * 1e3);
    return s;
  };
  for (int i = 0; i < a.num_iters_warmup; ++i) run_once(nullptr);
  std::vector<double> latencies, ttft;
  for (int i = 0; i < a.num_iters; ++i) latencies.push_back(run_once(&ttft));
  std::printf("Avg latency: %.6f seconds\n", mean(latencies));
  json pct = json::object();
  for (int q : {10, 25, 50, 75, 90, 99}) {
    const double v = percentile(latencies, q);
    std::printf("%d%% percentile latency: %.6f seconds\n", q, v);
    pct[std::to_string(q)] = v;
  }
  std::printf("Avg TTFT: %.2f ms (median %.2f ms)\n", mean(ttft), percentile(ttft, 50));
  write_json(a.output_json, {{"avg_latency", mean(latencies)},
                             {"latencies", latencies},
                             {"percentiles", pct},
                             {"avg_ttft_ms", mean(ttft)},
                             {"median_ttft_ms", percentile(ttft, 50)}});
}

void add_common(CLI::App* cmd, BenchArgs& a) {
  atom::cli::model_args_add(cmd, a.model);
  atom::cli::engine_args_add(cmd, a.engine);
  cmd->add_option("--input-len", a.input_len, "prompt tokens per request")->capture_default_str();
  cmd->add_option("--output-len", a.output_len, "generated tokens per request")
      ->capture_default_str();
  cmd->add_option("--output-json", a.output_json, "also write the results to this JSON file");
}

}  // namespace

ATOM_REGISTER_COMMAND([](CLI::App& app) {
  CLI::App* bench = atom::cli::bench_command(app);

  auto t = std::make_shared<BenchArgs>();
  auto* tp =
      bench->add_subcommand("throughput", "Requests and tokens per second for a batch of prompts");
  add_common(tp, *t);
  tp->add_option("--num-prompts", t->num_prompts, "requests")->capture_default_str();
  tp->add_option("--prefix-len", t->prefix_len, "tokens every prompt shares at its start")
      ->capture_default_str();
  tp->callback([t] { run_throughput(*t); });

  auto l = std::make_shared<BenchArgs>();
  l->input_len = 32;
  auto* lat = bench->add_subcommand("latency", "End-to-end latency of one batch");
  add_common(lat, *l);
  lat->add_option("--batch-size", l->batch_size, "prompts per batch")->capture_default_str();
  lat->add_option("--num-iters", l->num_iters, "timed iterations")->capture_default_str();
  lat->add_option("--num-iters-warmup", l->num_iters_warmup, "untimed iterations first")
      ->capture_default_str();
  lat->callback([l] { run_latency(*l); });
});
