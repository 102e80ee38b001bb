// Greedy outputs never depend on who else is in the batch: a request alone matches transformers'
// greedy tokens (the fixtures' references), and every request of a 31-request workload of mixed
// lengths matches the single-sequence runner (generate_greedy, which shares no scheduling, block
// or batching code with the engine) whether batched, chunked, preempted and recomputed, or served
// from the prefix cache. The hybrid models (Gated DeltaNet state in the slot pool) run the same
// scenarios: their state must follow each request through batching, chunking and preemption.
#include <map>

#include "common/test_util.h"
#include "engine_test_util.h"

namespace atom::test {
namespace {

class EngineGreedy : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineGreedy, AloneMatchesTransformers) {
  const Reference ref = reference_load(GetParam());
  Model& model = fixture_model(GetParam());
  LLMEngine engine(model, test_config());
  const auto out =
      engine.generate({ref.greedy_prompt}, greedy(static_cast<int>(ref.greedy_tokens.size())));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].outputs.at(0).token_ids, ref.greedy_tokens);
  EXPECT_EQ(out[0].outputs[0].finish_reason, FinishReason::kLength);
  expect_engine_idle(engine);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineGreedy, ::testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

std::vector<EngineScenario> scenarios() {
  EngineScenario thr{"long_prefill_threshold_no_cache", test_config()};
  thr.config.long_prefill_token_threshold = 5;
  thr.config.enable_prefix_caching = false;
  // 10 blocks: 8 hold one longest sequence. The state checkpoints: 8 slots for 31 requests,
  // reused as they go, in chunks of a 32-token budget.
  return {scenario_one_batch(),
          scenario_chunked(8, 16),
          thr,
          scenario_preempted(10, 8, 64),
          scenario_prefix_cache("prefix_cache_small_blocks"),
          scenario_state_checkpoints(8, 32)};
}

class EngineWorkload : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineWorkload, EveryRequestMatchesTheSingleSequenceRunner) {
  const Reference ref = reference_load(GetParam());
  Model& model = fixture_model(GetParam());
  Workload w = random_workload(30, 100, 20, model.vocab_size(), 17);
  // The fixture's own greedy prompt sits in the middle of the batch.
  w.prompts.insert(w.prompts.begin() + 15, ref.greedy_prompt);
  w.params.insert(w.params.begin() + 15, greedy(static_cast<int>(ref.greedy_tokens.size())));
  std::vector<std::vector<int32_t>> want;
  for (size_t i = 0; i < w.prompts.size(); ++i)
    want.push_back(
        generate_greedy(model, w.prompts[i], w.params[i].max_tokens, {}, true).token_ids);
  ASSERT_EQ(want[15], ref.greedy_tokens);

  for (const EngineScenario& sc : scenarios()) {
    SCOPED_TRACE(sc.name);
    LLMEngine engine(model, sc.config);
    for (int pass = 0; pass < (sc.run_twice ? 2 : 1); ++pass) {
      const auto out = engine.generate(w.prompts, w.params);
      int cached = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        const CompletionOutput& c = out[i].outputs.at(0);
        EXPECT_EQ(c.token_ids, want[i]) << "request " << i << " pass " << pass;
        EXPECT_EQ(c.finish_reason, FinishReason::kLength);
        cached += c.num_cached_tokens;
        EXPECT_EQ(c.token_times.size(), c.token_ids.size());
        EXPECT_GT(c.ttft, 0);
      }
      if (pass == 1 && model.state_specs().empty()) {
        EXPECT_GT(cached, 500) << "the second pass should be served from the cache";
      } else if (pass == 1 && sc.config.state_checkpoint_interval_tokens > 0) {
        // Fewer than the attention models' (8 checkpoints for 31 requests), but many.
        EXPECT_GT(cached, 100) << "the second pass should resume prefixes from state checkpoints";
        std::printf("%s: %d prompt tokens resumed from state checkpoints\n", GetParam().c_str(),
                    cached);
      } else if (pass == 1) {
        // Recurrent state summarises a whole prefix: without state checkpoints a hybrid model's
        // prompts are recomputed, never served from KV blocks alone.
        EXPECT_EQ(cached, 0) << "a hybrid model served a prefix without its recurrent state";
      }
      expect_engine_idle(engine);
    }
    if (sc.expect_preemption) {
      EXPECT_GT(engine.stats().num_preemptions, 0);
    }
    if (sc.name == "one_batch") {
      EXPECT_LT(engine.stats().num_steps, 25);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineWorkload,
                         ::testing::Values("llama3_gqa", "qwen3_sliding", "qwen3_moe", "mixtral",
                                           "glm4_moe", "gpt_oss", "deepseek_v2_lite", "deepseek_v3",
                                           "glm_moe_dsa", "qwen3_next", "qwen3_5", "kimi_linear",
                                           "deepseek_v4", "deepseek_v41", "glm5_next", "kimi_k3"),
                         [](const auto& info) { return info.param; });

// The prefix cache's hit count, exactly, on a workload whose sharing is known by construction
// (tests/engine/block_manager_test.cpp, PrefixHitsOfAKnownSharingPattern, spells out the
// blocks): the engine reports each request's cached tokens and the total hits. Greedy tokens
// cannot show a lost hit (recomputing gives the same tokens), so only these counts can.
TEST(EnginePrefixCache, HitCountsOfAKnownSharingPattern) {
  Model& model = fixture_model("llama3_gqa");
  EngineConfig c = test_config();
  c.block_size = 4;
  LLMEngine engine(model, c);
  const std::vector<int32_t> X = {11, 12, 13, 14}, Y = {21, 22, 23, 24}, Z = {31, 32, 33, 34},
                             W = {41, 42, 43, 44};
  auto cat = [](std::initializer_list<std::vector<int32_t>> parts, int32_t last) {
    std::vector<int32_t> t;
    for (const auto& p : parts) t.insert(t.end(), p.begin(), p.end());
    t.push_back(last);
    return t;
  };
  const std::vector<std::vector<int32_t>> prompts = {
      cat({X, Y, Z, W}, 101), cat({X, Y, Z, W}, 102), cat({Y, Z, W, X}, 103),
      cat({Y, Z, W, X}, 104), cat({X, X, X, X}, 105), cat({X, X, X, X}, 106)};
  const std::vector<int> want = {0, 16, 0, 16, 4, 16};
  int64_t total = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto out = engine.generate({prompts[i]}, greedy(2)).at(0).outputs.at(0);
    EXPECT_EQ(out.num_cached_tokens, want[i]) << "request " << i + 1;
    EXPECT_EQ(out.token_ids, generate_greedy(model, prompts[i], 2, {}, true).token_ids);
    total += want[i];
  }
  EXPECT_EQ(engine.stats().prefix_cache_hits, total);
  EXPECT_EQ(engine.stats().prefix_cache_queries, 6 * 17);
  // A repeat of everything is served from the cache: all 16 full-block tokens of each.
  const auto again = engine.generate(prompts, greedy(2));
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(again[i].outputs.at(0).num_cached_tokens, 16) << "repeat of request " << i + 1;
  expect_engine_idle(engine);
}

// Hybrid models (recurrent state): a prefix is served only as far as a state checkpoint reaches
// (every 8 tokens here, blocks of 4), on a sharing pattern known by construction; the greedy
// tokens are the single-sequence runner's (no cache), which matches transformers.
TEST(EnginePrefixCache, HybridHitsStopAtStateCheckpoints) {
  for (const char* name : {"kimi_linear", "qwen3_next"}) {
    SCOPED_TRACE(name);
    Model& model = fixture_model(name);
    const std::vector<int32_t> base = reference_load(name).input_ids;
    EngineConfig c = test_config();
    c.block_size = 4;
    c.state_checkpoint_interval_tokens = 8;
    LLMEngine engine(model, c);
    auto cat = [&](int shared, std::vector<int32_t> tail) {
      std::vector<int32_t> t(base.begin(), base.begin() + shared);
      t.insert(t.end(), tail.begin(), tail.end());
      return t;
    };
    std::vector<int32_t> tail10(10), tail1(1);
    for (int i = 0; i < 10; ++i) tail10[static_cast<size_t>(i)] = 3 + i;
    tail1[0] = 3;
    const std::vector<std::vector<int32_t>> prompts = {
        cat(30, {}),      // 30 tokens: checkpoints at 8, 16, 24
        cat(20, tail10),  // shares 5 full blocks; checkpoints up to 16
        cat(30, {}),      // 7 full blocks hit; the checkpoint at 24
        cat(6, tail10),   // one full block shared: no checkpoint that short
        cat(29, tail1)};  // 7 full blocks of request 1's, then a different token: 24
    const std::vector<int> want = {0, 16, 24, 0, 24};
    int64_t total = 0, queries = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto out = engine.generate({prompts[i]}, greedy(3)).at(0).outputs.at(0);
      EXPECT_EQ(out.num_cached_tokens, want[i]) << "request " << i + 1;
      EXPECT_EQ(out.token_ids, generate_greedy(model, prompts[i], 3, {}, true).token_ids)
          << "request " << i + 1;
      total += want[i];
      queries += static_cast<int64_t>(prompts[i].size());
    }
    EXPECT_EQ(engine.stats().prefix_cache_hits, total);
    EXPECT_EQ(engine.stats().prefix_cache_queries, queries);
    // All at once: request 4's own checkpoint at 8 now serves its repeat too.
    const auto again = engine.generate(prompts, greedy(3));
    const std::vector<int> want_again = {24, 24, 24, 8, 24};
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(again[i].outputs.at(0).num_cached_tokens, want_again[i])
          << "repeat of request " << i + 1;
      EXPECT_EQ(again[i].outputs.at(0).token_ids,
                generate_greedy(model, prompts[i], 3, {}, true).token_ids)
          << "repeat of request " << i + 1;
    }
    // n = 2: the second sample waits for the first's prefill and resumes from its checkpoint at
    // 32 of a new 35-token prompt.
    const std::vector<int32_t> fresh(base.begin() + 40, base.begin() + 75);
    SamplingParams two = greedy(2);
    two.n = 2;
    const auto pair = engine.generate({fresh}, two).at(0);
    ASSERT_EQ(pair.outputs.size(), 2u);
    const auto want_fresh = generate_greedy(model, fresh, 2, {}, true).token_ids;
    EXPECT_EQ(pair.outputs[0].num_cached_tokens, 0);
    EXPECT_EQ(pair.outputs[1].num_cached_tokens, 32);
    for (const auto& o : pair.outputs) EXPECT_EQ(o.token_ids, want_fresh);
    expect_engine_idle(engine);

    // One checkpoint slot: each new checkpoint evicts the last, and a prefix whose checkpoints
    // are gone is recomputed (correctly) from the start. (Two new tokens: 3 would compute
    // through token 32, whose checkpoint would evict the prompt's at 24.)
    c.num_state_checkpoints = 1;
    LLMEngine one(model, c);
    const std::vector<size_t> order = {0, 0, 1};  // request 1, again, then request 2
    const std::vector<int> want_one = {0, 24, 0};
    for (size_t k = 0; k < order.size(); ++k) {
      const auto& p = prompts[order[k]];
      const auto out = one.generate({p}, greedy(2)).at(0).outputs.at(0);
      EXPECT_EQ(out.num_cached_tokens, want_one[k]) << "one checkpoint slot, run " << k + 1;
      EXPECT_EQ(out.token_ids, generate_greedy(model, p, 2, {}, true).token_ids);
    }
    expect_engine_idle(one);
  }
  EngineConfig bad = test_config();
  bad.block_size = 4;
  bad.state_checkpoint_interval_tokens = 6;
  EXPECT_ERROR_CONTAINS(LLMEngine(fixture_model("kimi_linear"), bad),
                        "state_checkpoint_interval_tokens", "multiple of block_size 4", "6");
}

TEST(EngineStops, StopTokenIdsEosAndMinTokens) {
  Model& model = fixture_model("llama3_gqa");
  const Reference ref = reference_load("llama3_gqa");
  const std::vector<int32_t>& full = ref.greedy_tokens;
  ASSERT_GE(full.size(), 6u);
  const int32_t stop = full[2];
  const size_t first = std::find(full.begin(), full.end(), stop) - full.begin();

  LLMEngine engine(model, test_config());
  SamplingParams p = greedy(static_cast<int>(full.size()));
  p.stop_token_ids = {stop};
  auto out = engine.generate({ref.greedy_prompt}, p).at(0).outputs.at(0);
  EXPECT_EQ(out.token_ids, std::vector<int32_t>(full.begin(), full.begin() + first + 1));
  EXPECT_EQ(out.finish_reason, FinishReason::kStop);
  EXPECT_EQ(std::get<int32_t>(out.stop_reason), stop);

  // As an EOS id from generation_config.json it stops too, with no stop_reason; ignore_eos runs on.
  GenerationConfig gen;
  gen.eos_token_ids = {stop};
  LLMEngine with_eos(model, test_config(), gen);
  p.stop_token_ids.clear();
  p.ignore_eos = false;
  out = with_eos.generate({ref.greedy_prompt}, p).at(0).outputs.at(0);
  EXPECT_EQ(out.token_ids.size(), first + 1);
  EXPECT_EQ(out.finish_reason, FinishReason::kStop);
  EXPECT_TRUE(std::holds_alternative<std::monostate>(out.stop_reason));
  EXPECT_EQ(generate_greedy(model, ref.greedy_prompt, p.max_tokens, {stop}, false).token_ids,
            out.token_ids);
  p.ignore_eos = true;
  EXPECT_EQ(with_eos.generate({ref.greedy_prompt}, p).at(0).outputs.at(0).token_ids, full);

  // min_tokens: the stop id may not be drawn before then.
  p.ignore_eos = false;
  p.min_tokens = static_cast<int>(first) + 2;
  out = with_eos.generate({ref.greedy_prompt}, p).at(0).outputs.at(0);
  ASSERT_GE(out.token_ids.size(), static_cast<size_t>(p.min_tokens));
  for (int i = 0; i < p.min_tokens; ++i) EXPECT_NE(out.token_ids[i], stop);
  EXPECT_EQ(std::vector<int32_t>(out.token_ids.begin(), out.token_ids.begin() + first),
            std::vector<int32_t>(full.begin(), full.begin() + first));

  // Length wins when the last allowed token is the stop token (vLLM's order).
  p.min_tokens = 0;
  p.max_tokens = static_cast<int>(first) + 1;
  EXPECT_EQ(with_eos.generate({ref.greedy_prompt}, p).at(0).outputs.at(0).finish_reason,
            FinishReason::kLength);
  expect_engine_idle(with_eos);
}

TEST(EngineApi, StepDrivenRequestsAndGenerateShareTheEngine) {
  Model& model = fixture_model("qwen3_tied");
  LLMEngine engine(model, test_config());
  const std::vector<int32_t> a = {5, 6, 7, 8}, b = {9, 10, 11};
  engine.add_request("mine", a, greedy(30));
  const auto out = engine.generate({b}, greedy(4));
  EXPECT_EQ(out.at(0).outputs.at(0).token_ids, generate_greedy(model, b, 4, {}, true).token_ids);
  std::vector<RequestOutput> later;
  std::vector<int32_t> streamed;
  while (engine.has_unfinished()) {
    StepOutput s = engine.step();
    for (const TokenEvent& e : s.tokens) {
      EXPECT_EQ(*e.request_id, "mine");
      EXPECT_EQ(e.seq->tokens.back(), e.token_id);
      streamed.push_back(e.token_id);
    }
    for (auto& o : s.finished) later.push_back(std::move(o));
  }
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].request_id, "mine");
  const auto want = generate_greedy(model, a, 30, {}, true).token_ids;
  EXPECT_EQ(later[0].outputs.at(0).token_ids, want);
  // Tokens produced while generate() ran are in the output, the rest were streamed after.
  ASSERT_LE(streamed.size(), want.size());
  EXPECT_TRUE(std::equal(streamed.begin(), streamed.end(), want.end() - streamed.size()));
  expect_engine_idle(engine);
}

// The scheduled counts reach a front end before the step's forward runs (a long prefill shows
// as running), and a finished request's phases add up: prefill + decode = inference, and the
// request that waited behind max_num_seqs 1 has the longer queue time.
TEST(EngineApi, ScheduledCountsAndRequestPhases) {
  Model& model = fixture_model("qwen3_tied");
  EngineConfig c = test_config();
  c.max_num_seqs = 1;
  LLMEngine engine(model, c);
  std::vector<std::pair<int, int>> seen;
  int steps = 0;
  engine.set_on_scheduled([&](int running, int waiting) {
    seen.emplace_back(running, waiting);
    EXPECT_EQ(engine.stats().num_steps, steps) << "called before the step's forward completes";
  });
  engine.add_request("a", {5, 6, 7, 8, 9, 10}, greedy(8));
  engine.add_request("b", {11, 12, 13}, greedy(3));
  std::map<std::string, RequestOutput> done;
  const auto loop_start = std::chrono::steady_clock::now();
  while (engine.has_unfinished()) {
    const size_t before = seen.size();
    StepOutput s = engine.step();
    ++steps;
    ASSERT_EQ(seen.size(), before + 1) << "one call per step";
    for (auto& o : s.finished) done[o.request_id] = std::move(o);
  }
  // The first step is a's prefill: a running, b waiting, reported before its forward.
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.front(), std::make_pair(1, 1));
  EXPECT_EQ(seen.back(), std::make_pair(1, 0));
  ASSERT_EQ(done.size(), 2u);
  for (const auto& [id, o] : done) {
    EXPECT_TRUE(o.scheduled && o.produced) << id;
    EXPECT_GT(o.prefill_time, 0) << id;
    EXPECT_GE(o.decode_time, 0) << id;
    EXPECT_NEAR(o.prefill_time + o.decode_time, o.inference_time, 1e-9) << id;
    EXPECT_LE(o.queue_time + o.inference_time, o.e2e_latency + 1e-9) << id;
  }
  EXPECT_GT(done["b"].queue_time, done["a"].queue_time + done["a"].prefill_time);
  EXPECT_GT(done["a"].decode_time, 0);
  // The steps' wall time holds their forwards and fits in the loop's; the host's part is the
  // rest (bench throughput and /metrics report it per step).
  const double loop =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count();
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.num_steps, steps);
  EXPECT_GT(st.forward_seconds, 0);
  EXPECT_GT(st.step_seconds, st.forward_seconds);
  EXPECT_LE(st.step_seconds, loop);
  engine.set_on_scheduled({});
  expect_engine_idle(engine);
}

}  // namespace
}  // namespace atom::test
