// The engine over tensor-parallel ranks on the CPU: 2 and 4 ranks as threads of this process
// (LocalGroup collectives), each holding only its shards and its kv heads of every KV block,
// driven in lockstep by one scheduler. Alone, a request gives transformers' greedy tokens; in a
// batch of mixed requests (one batch, chunked prefill with mixed steps, preempted and recomputed,
// served from the prefix cache) every request gives what the single-rank engine gives. The same
// with expert parallelism (ranks holding whole experts) for mixtures of experts.
#include "common/test_util.h"
#include "engine/tp_runner.h"
#include "engine_test_util.h"
#include "models/draft_model.h"
#include "models/model_group.h"

namespace atom::test {
namespace {

std::unique_ptr<ModelGroup> tp_model(const std::string& name, int tp, bool ep = false,
                                     int redundant = 0, int pp = 1,
                                     const std::vector<int>& partition = {}, bool dp = false) {
  ModelOptions o;
  o.data_parallel_attention = dp;  // the tp ranks split sequences for attention instead
  o.pp_size = pp;
  o.pp_layer_partition = partition;
  o.expert_parallel = ep;
  o.num_redundant_experts = redundant;
  o.eplb_step_interval = 3;  // re-placed every 3 steps: many times in a workload
  return model_group_load(fixture_dir(name), o, tp);
}

struct Case {
  std::string fixture;
  int tp;
  bool ep = false;                  // expert parallelism over the tp ranks
  int redundant = 0;                // EPLB's redundant experts
  int pp = 1;                       // pipeline stages of tp ranks each
  std::vector<int> partition = {};  // their layers (VLLM_PP_LAYER_PARTITION); {}: vLLM's split
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.fixture << " tp " << c.tp << (c.ep ? " ep" : "") << " redundant " << c.redundant
      << " pp " << c.pp;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.fixture + "_tp" + std::to_string(info.param.tp) + (info.param.ep ? "_ep" : "") +
         (info.param.redundant ? "_redundant" + std::to_string(info.param.redundant) : "") +
         (info.param.pp > 1 ? "_pp" + std::to_string(info.param.pp) : "") +
         (info.param.partition.empty() ? "" : "_partitioned");
}

class EngineTp : public ::testing::TestWithParam<Case> {};

TEST_P(EngineTp, AloneMatchesTransformers) {
  const auto [name, tp, ep, redundant, pp, partition] = GetParam();
  const Reference ref = reference_load(name);
  auto models = tp_model(name, tp, ep, redundant, pp, partition);
  ASSERT_EQ(models->tp_size(), tp);
  LLMEngine engine(*models, test_config());
  expect_alone_gives_reference(engine, ref);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, EngineTp,
    ::testing::Values(Case{"llama3_gqa", 2}, Case{"llama3_gqa", 4},  // 2 kv heads: replicated
                      Case{"qwen3_tied", 2}, Case{"qwen3_tied", 4},
                      Case{"qwen3_sliding", 2},                   // 1 kv head, window
                      Case{"llama_yarn_bias_legacy", 2},          // biases
                      Case{"qwen3_moe", 2}, Case{"glm4_moe", 2},  // MoE
                      Case{"qwen3_moe", 2, true}, Case{"glm4_moe", 4, true},
                      Case{"deepseek_v2_lite", 2, true}, Case{"qwen3_moe", 2, true, 2},
                      Case{"kimi_linear", 2},  // KDA heads split
                      Case{"qwen3_next", 2},   // GDN heads split
                      Case{"qwen3_5", 2}, Case{"deepseek_v4", 2}, Case{"glm5_next", 2},
                      // pipeline stages (of 1 or 2 tensor-parallel ranks)
                      Case{"llama3_gqa", 1, false, 0, 2}, Case{"qwen3_tied", 1, false, 0, 3},
                      Case{"deepseek_v2_lite", 2, false, 0, 2}, Case{"qwen3_next", 1, false, 0, 2},
                      Case{"glm_moe_dsa", 1, false, 0, 3},  // a shared layer opens stage 1
                      Case{"deepseek_v4", 1, false, 0, 2}, Case{"glm5_next", 1, false, 0, 2},
                      // DeepSeek-V4.1: CSA2's reads of other layers' rows on every rank; stages
                      // of layers 0-1 and 2-4, each layer with its sources
                      Case{"deepseek_v41", 2}, Case{"deepseek_v41", 2, true},
                      Case{"deepseek_v41", 1, false, 0, 2, {2, 3}}),
    case_name);

std::vector<EngineScenario> scenarios() {
  // The hybrids' prefixes through state checkpoints (each rank checkpoints its own heads' state).
  return {scenario_one_batch(), scenario_chunked(6, 16), scenario_preempted(10, 6, 48),
          scenario_prefix_cache(), scenario_state_checkpoints(6, 32)};
}

class EngineTpWorkload : public ::testing::TestWithParam<Case> {};

// The single-rank engine's tokens are the reference: the ranks only split the sums, so greedy
// choices agree unless two logits tie to ~1e-6, which these seeded workloads do not hit.
TEST_P(EngineTpWorkload, EveryRequestMatchesTheSingleRankEngine) {
  const auto [name, tp, ep, redundant, pp, partition] = GetParam();
  Model& solo = fixture_model(name);
  auto models = tp_model(name, tp, ep, redundant, pp, partition);
  const Workload w = random_workload(18, 80, 12, solo.vocab_size(), 29);
  for (const EngineScenario& sc : scenarios()) {
    SCOPED_TRACE(sc.name);
    LLMEngine one(solo, sc.config);
    const auto want = one.generate(w.prompts, w.params);
    LLMEngine engine(*models, sc.config);
    EXPECT_EQ(engine.kv_plan().num_blocks, one.kv_plan().num_blocks);
    for (int pass = 0; pass < (sc.run_twice ? 2 : 1); ++pass) {
      const int cached = expect_same_tokens(engine.generate(w.prompts, w.params), want, pass);
      if (pass == 1 && solo.state_specs().empty()) {
        EXPECT_GT(cached, 300) << "the second pass should be served from the cache";
      } else if (pass == 1 && sc.config.state_checkpoint_interval_tokens > 0) {
        // The same prefixes resume from checkpoints as on one rank (the scheduler is the same).
        int one_cached = 0;
        for (const auto& o : one.generate(w.prompts, w.params))
          one_cached += o.outputs.at(0).num_cached_tokens;
        EXPECT_GT(one_cached, 0) << "the second pass should resume prefixes from state checkpoints";
        EXPECT_EQ(cached, one_cached);
      } else if (pass == 1) {  // a hybrid's prefix needs its recurrent state, never KV alone
        EXPECT_EQ(cached, 0);
      }
      expect_engine_idle(engine);
    }
    if (sc.expect_preemption) {
      EXPECT_GT(engine.stats().num_preemptions, 0);
    }
    if (redundant > 0) {
      EXPECT_GE(engine.stats().eplb_rebalances, 2);
      EXPECT_GT(engine.stats().eplb_layers_moved, 0) << "the experts never moved";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, EngineTpWorkload,
    ::testing::Values(Case{"llama3_gqa", 2}, Case{"llama3_gqa", 4}, Case{"qwen3_tied", 2},
                      Case{"mixtral", 2}, Case{"mixtral", 2, true}, Case{"qwen3_moe", 4, true},
                      Case{"qwen3_moe", 4, true, 4}, Case{"kimi_linear", 2}, Case{"qwen3_next", 2},
                      Case{"qwen3_5_moe", 2, true}, Case{"glm5_next", 2},
                      Case{"deepseek_v4", 2, true},
                      // pipeline stages: dense, pp x tp with expert
                      // parallelism, a hybrid's states per stage
                      Case{"llama3_gqa", 1, false, 0, 3}, Case{"qwen3_moe", 2, true, 0, 2},
                      Case{"qwen3_next", 1, false, 0, 2}, Case{"deepseek_v4", 1, false, 0, 2},
                      Case{"deepseek_v41", 2, true}, Case{"deepseek_v41", 2, false, 0, 2, {2, 3}}),
    case_name);

TEST(EngineTpSampling, SeededSamplingAndLogprobsMatchTheSingleRankEngine) {
  Model& solo = fixture_model("qwen3_tied");
  auto models = tp_model("qwen3_tied", 2);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 5 + 9 * i; ++j) p.push_back(3 + (j * 37 + i * 11) % 700);
    prompts.push_back(p);
    SamplingParams sp = greedy(10);
    sp.temperature = 0.7;
    sp.top_k = 40;
    sp.seed = 100 + i;
    if (i % 2) sp.logprobs = 2;
    params.push_back(sp);
  }
  LLMEngine one(solo, test_config());
  LLMEngine tp(*models, test_config());
  const auto want = one.generate(prompts, params);
  const auto got = tp.generate(prompts, params);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& a = got[i].outputs.at(0);
    const auto& b = want[i].outputs.at(0);
    EXPECT_EQ(a.token_ids, b.token_ids) << i;
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << i;
    for (size_t k = 0; k < a.logprobs.size(); ++k)
      // logit - logsumexp: at most twice the logits' tensor-parallel difference.
      EXPECT_NEAR(a.logprobs[k].logprob, b.logprobs[k].logprob, 2 * kTpLogitTolerance)
          << i << " " << k;
  }
}

TEST(EngineTpRunner, ScoresMatchTheSingleRankRunnerAndKvIsSharded) {
  const Reference ref = reference_load("llama3_gqa");
  Model& solo = fixture_model("llama3_gqa");
  const Tensor want = score_tokens(solo, ref.input_ids);
  for (int tp : {2, 4}) {
    auto models = tp_model("llama3_gqa", tp);
    // Prefill in chunks that straddle pages: each rank's cache shard carries the context.
    const Tensor got = score_tokens(*models, ref.input_ids, /*chunk=*/5, /*block_size=*/4);
    // Against one rank: the all-reduce reorders fp32 sums (measured 6.6-7.6e-6).
    expect_logits_near(got, want, kTpLogitTolerance, "tp " + std::to_string(tp));
    expect_logits_near(got, ref.logits, kCpuLogitTolerance,
                       "tp " + std::to_string(tp) + " vs transformers");
    const GreedyResult g = generate_greedy(*models, ref.greedy_prompt,
                                           static_cast<int>(ref.greedy_tokens.size()), {}, true);
    EXPECT_EQ(g.token_ids, ref.greedy_tokens) << "tp " << tp;
    // 2 kv heads over tp ranks: one per rank (replicated at tp 4), so a block is half as large.
    const KvCachePlan one = kv_cache_plan(solo, test_config());
    const KvCachePlan per_rank = kv_cache_plan(models->model(), test_config());
    EXPECT_EQ(per_rank.block_bytes * 2, one.block_bytes) << "tp " << tp;
    RunnerOptions o;
    o.num_pages = 12;
    o.max_model_len = 48;
    TpRunner runner(*models, o);
    EXPECT_EQ(runner.ranks(), tp);
    EXPECT_EQ(runner.num_pages(), 12);
    for (int r = 0; r < tp; ++r) {
      EXPECT_EQ(runner.rank(r).kv().key(0).size(0), 12);
      EXPECT_EQ(runner.rank(r).kv().key(0).size(2), 1) << "kv heads on rank " << r;
    }
  }
}

TEST(EngineTpErrors, ClearMessages) {
  EXPECT_ERROR_CONTAINS(tp_model("llama3_gqa", 3), "not divisible by the tensor-parallel size 3");
  EXPECT_ERROR_CONTAINS(tp_model("llama3_gqa", 0), "--tensor-parallel-size must be at least 1");
  ModelOptions gpu;
  gpu.device = Device::cuda(0);
  EXPECT_ERROR_CONTAINS(model_group_load(fixture_dir("llama3_gqa"), gpu, 64),
                        "--tensor-parallel-size 64 needs 64 GPUs (cuda to cuda:63), but");
  // A KV cache too small for one sequence is refused on every rank, naming the numbers.
  auto models = tp_model("llama3_gqa", 2);
  EngineConfig c = test_config();
  c.num_gpu_blocks_override = 3;
  EXPECT_ERROR_CONTAINS(LLMEngine(*models, c), "the KV cache holds 3 blocks");
}

// Speculative decoding over tensor-parallel ranks (and pipeline stages of them, the drafter on the
// last stage, its embedding from the first): the checkpoints' MTP drafter whole on the
// leader, its embedding and head gathered from the ranks' vocabulary shards (the random-weight
// fixtures share them with the target), drafting from the leader's hidden states; the ranks
// verify K + 1 rows per sequence, and a hybrid's ranks roll their heads' recurrent state back.
// Every request gives what the same ranks give without speculation and what one rank gives with
// it (the same drafts: the drafter reads the same hidden states to ~1e-6).
struct SpecCase {
  std::string fixture;
  int tp;
  int pp = 1;
  bool dp = false;  // data-parallel attention over the tp ranks
};

class EngineTpSpec : public ::testing::TestWithParam<SpecCase> {};

// DeepSeek-V4.1's DSpark drafter reads the target's layer outputs, which only a single rank's
// runner keeps: over tensor-parallel ranks or pipeline stages (layers 0-1, 2-4) the engine refuses
// it by name, and the target alone runs.
TEST(EngineTpSpecErrors, DSparkOverSeveralRanksIsRefused) {
  const std::string name = "deepseek_v41_dspark";
  for (const auto& [tp, pp] : {std::pair{2, 1}, std::pair{1, 2}}) {
    SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp));
    auto models =
        tp_model(name, tp, false, 0, pp, pp > 1 ? std::vector<int>{2, 3} : std::vector<int>{});
    LoadedDrafter d = drafter_load(fixture_dir(name), *models, ModelOptions{});
    EngineConfig c = test_config();
    c.speculative_method = "dspark";
    c.num_speculative_tokens = 3;
    EXPECT_ERROR_CONTAINS(LLMEngine(*models, c, {}, {}, d.model.get()),
                          "speculative decoding with method 'dspark' runs on one rank so far, "
                          "not 2");
    LLMEngine plain(*models, test_config());
    EXPECT_EQ(plain.generate({{3, 4, 5}}, greedy(4)).at(0).outputs.at(0).token_ids.size(), 4u);
  }
}

TEST_P(EngineTpSpec, GreedyMatchesPlainDecodingOnTheSameRanks) {
  const auto [name, tp, pp, dp] = GetParam();
  Model& solo = fixture_model(name);
  auto models = tp_model(name, tp, false, 0, pp, {}, dp);
  LoadedDrafter d = drafter_load(fixture_dir(name), *models, ModelOptions{});
  LoadedDrafter d1 = drafter_load(fixture_dir(name), solo, ModelOptions{});
  // The gathered tensors are the single-rank target's, bit for bit.
  EXPECT_EQ(d.shared, d1.shared);
  for (const std::string& n : d.shared)
    EXPECT_EQ(max_abs_diff(d.model->params().find(n)->data(), d1.model->params().find(n)->data()),
              0.0f)
        << n;
  EXPECT_FALSE(d.shared.empty()) << "the fixture's drafter shares no tensor with its target";
  const Workload w = random_workload(8, 40, 16, solo.vocab_size(), 61);
  LLMEngine plain(*models, test_config());
  const auto want = plain.generate(w.prompts, w.params);
  for (int k : {1, 3}) {
    EngineConfig c = test_config();
    c.speculative_method = "mtp";
    c.num_speculative_tokens = k;
    LLMEngine spec(*models, c, {}, {}, d.model.get());
    ASSERT_TRUE(spec.speculative());
    LLMEngine spec1(solo, c, {}, {}, d1.model.get());
    const auto got = spec.generate(w.prompts, w.params);
    const auto got1 = spec1.generate(w.prompts, w.params);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].outputs.at(0).token_ids, want[i].outputs.at(0).token_ids)
          << "K " << k << " request " << i;
      EXPECT_EQ(got[i].outputs.at(0).token_ids, got1[i].outputs.at(0).token_ids)
          << "K " << k << " request " << i << " against one rank";
    }
    const EngineStats s = spec.stats(), s1 = spec1.stats();
    std::printf(
        "%s tp %d pp %d K=%d: %lld verifications, %lld draft tokens, %lld accepted (one rank: "
        "%lld, %lld, %lld)\n",
        name.c_str(), tp, pp, k, static_cast<long long>(s.spec_num_drafts),
        static_cast<long long>(s.spec_num_draft_tokens),
        static_cast<long long>(s.spec_num_accepted_tokens),
        static_cast<long long>(s1.spec_num_drafts),
        static_cast<long long>(s1.spec_num_draft_tokens),
        static_cast<long long>(s1.spec_num_accepted_tokens));
    // The random-weight drafters' drafts are rejected (the oracle below has them accepted): the
    // same drafts as one rank's.
    EXPECT_GT(s.spec_num_drafts, 0);
    EXPECT_EQ(s.spec_num_draft_tokens, s1.spec_num_draft_tokens);
    EXPECT_EQ(s.spec_num_accepted_tokens, s1.spec_num_accepted_tokens);
    expect_engine_idle(spec);
  }
  // Long accepted runs and planted mistakes on the ranks (the hybrids' rollback of each rank's
  // heads): a proposer that knows the output.
  for (int bad_every : {0, 5}) {
    EngineConfig c = test_config();
    c.num_speculative_tokens = 3;
    LLMEngine spec(*models, c);
    std::vector<std::vector<int32_t>> outs;
    for (const auto& o : want) outs.push_back(o.outputs.at(0).token_ids);
    spec.set_proposer(
        std::make_unique<OracleProposer>(by_prompt(w, outs), solo.vocab_size(), bad_every));
    const auto got = spec.generate(w.prompts, w.params);
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(got[i].outputs.at(0).token_ids, outs[i])
          << "oracle, bad_every " << bad_every << " request " << i;
    const EngineStats s = spec.stats();
    EXPECT_GT(s.spec_accepted_per_position[2], 0) << "no run of 3 accepted";
    if (bad_every > 0)
      EXPECT_LT(s.spec_num_accepted_tokens, s.spec_num_draft_tokens);
    else
      EXPECT_EQ(s.spec_num_accepted_tokens, s.spec_num_draft_tokens);
    expect_engine_idle(spec);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Drafters, EngineTpSpec,
    ::testing::Values(SpecCase{"deepseek_v3_mtp", 2}, SpecCase{"qwen3_next_mtp", 2},
                      SpecCase{"qwen3_5_moe_mtp", 2},
                      // pipeline stages: the drafter on the last, its
                      // embedding from the first; micro-batches
                      SpecCase{"deepseek_v3_mtp", 1, 2}, SpecCase{"qwen3_next_mtp", 2, 2},
                      // data-parallel attention: the drafter whole on the leader, its cache over
                      // every rank's pages; the ranks verify their own sequences' drafts
                      SpecCase{"deepseek_v3_mtp", 2, 1, true},
                      SpecCase{"deepseek_v3_mtp", 4, 1, true}),
    [](const auto& info) {
      return info.param.fixture + "_tp" + std::to_string(info.param.tp) +
             (info.param.pp > 1 ? "_pp" + std::to_string(info.param.pp) : std::string()) +
             (info.param.dp ? "_dp" : "");
    });

}  // namespace
}  // namespace atom::test
