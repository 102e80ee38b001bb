// Data-parallel attention on CPU ranks (vLLM's --data-parallel-size for DeepSeek's latent
// attention; layers/dp_attention.h): 2 and 4 ranks as threads of this process, each holding every
// attention head and the KV of its own sequences only (the engine's block partition r), the
// other layers tensor-parallel (or the experts expert-parallel) over the same ranks. Alone, a
// request gives transformers' greedy tokens; in a batch of mixed requests (one batch, chunked
// prefill with mixed steps, preempted and recomputed, served from the prefix cache) every request
// gives what the single-rank engine gives. A step's logits equal one rank's and each rank's cache
// holds exactly its sequences' latent rows.
#include <algorithm>
#include <cmath>

#include "common/test_util.h"
#include "engine/tp_runner.h"
#include "engine_test_util.h"
#include "models/model_group.h"

namespace atom::test {
namespace {

// dp groups of tp ranks (vLLM's -dp D -tp T): D x T ranks in all.
std::unique_ptr<ModelGroup> dp_model(const std::string& name, int dp, bool ep = false, int tp = 1) {
  ModelOptions o;
  o.data_parallel_attention = true;
  o.attention_tp_size = tp;
  o.expert_parallel = ep;
  return model_group_load(fixture_dir(name), o, dp * tp);
}

struct DpCase {
  std::string fixture;
  int dp;
  bool ep = false;
  int tp = 1;  // each group's attention tensor-parallel over this many ranks
};

void PrintTo(const DpCase& c, std::ostream* os) {
  *os << c.fixture << " dp " << c.dp << " tp " << c.tp << (c.ep ? " ep" : "");
}

std::string dp_case_name(const ::testing::TestParamInfo<DpCase>& info) {
  return info.param.fixture + "_dp" + std::to_string(info.param.dp) +
         (info.param.tp > 1 ? "_tp" + std::to_string(info.param.tp) : "") +
         (info.param.ep ? "_ep" : "");
}

class EngineDp : public ::testing::TestWithParam<DpCase> {};

TEST_P(EngineDp, AloneMatchesTransformers) {
  const auto [name, dp, ep, tp] = GetParam();
  const Reference ref = reference_load(name);
  auto models = dp_model(name, dp, ep, tp);
  ASSERT_TRUE(models->model().data_parallel_attention());
  EXPECT_EQ(models->model().data_parallel_size(), dp);
  LLMEngine engine(*models, test_config());
  EXPECT_EQ(engine.block_manager().num_partitions(), dp);
  expect_alone_gives_reference(engine, ref);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, EngineDp,
    ::testing::Values(DpCase{"deepseek_v2_lite", 2}, DpCase{"deepseek_v2_lite", 4, true},
                      DpCase{"deepseek_v3", 2, true}, DpCase{"deepseek_v3", 4},
                      DpCase{"deepseek_v3_plain", 2}, DpCase{"deepseek_v32", 2, true},
                      DpCase{"glm_moe_dsa", 2}, DpCase{"glm_moe_dsa", 4},
                      // groups of two tensor-parallel ranks
                      DpCase{"deepseek_v2_lite", 2, false, 2}, DpCase{"deepseek_v3", 2, true, 2},
                      DpCase{"glm_moe_dsa", 2, false, 2}),
    dp_case_name);

std::vector<EngineScenario> dp_scenarios() {
  // Each rank's cache holds 8 blocks of 16 tokens, one sequence of max_model_len: the partitions
  // run out and preempt.
  return {scenario_one_batch(), scenario_chunked(6, 16), scenario_preempted(8, 8, 48),
          scenario_prefix_cache()};
}

class EngineDpWorkload : public ::testing::TestWithParam<DpCase> {};

// The single-rank engine's tokens are the reference: the ranks only reorder the sums of the
// tensor-parallel layers (and every row's attention is one rank's, whole), so greedy choices
// agree unless two logits tie to ~1e-6, which these seeded workloads do not hit.
TEST_P(EngineDpWorkload, EveryRequestMatchesTheSingleRankEngine) {
  const auto [name, dp, ep, tp] = GetParam();
  Model& solo = fixture_model(name);
  auto models = dp_model(name, dp, ep, tp);
  const Workload w = random_workload(18, 80, 12, solo.vocab_size(), 29);
  for (const EngineScenario& sc : dp_scenarios()) {
    SCOPED_TRACE(sc.name);
    LLMEngine one(solo, sc.config);
    const auto want = one.generate(w.prompts, w.params);
    LLMEngine engine(*models, sc.config);
    // Every rank sizes its own cache as one rank would: dp times the blocks in all.
    EXPECT_EQ(engine.kv_plan().num_blocks, dp * one.kv_plan().num_blocks);
    EXPECT_EQ(engine.block_manager().num_partitions(), dp);
    for (int pass = 0; pass < (sc.run_twice ? 2 : 1); ++pass) {
      const int cached = expect_same_tokens(engine.generate(w.prompts, w.params), want, pass);
      if (pass == 1) {
        EXPECT_GT(cached, 300) << "the second pass should be served from the partitions' caches";
      }
      expect_engine_idle(engine);
    }
    if (sc.expect_preemption) {
      EXPECT_GT(engine.stats().num_preemptions, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineDpWorkload,
                         ::testing::Values(DpCase{"deepseek_v2_lite", 2},
                                           DpCase{"deepseek_v3", 2, true},
                                           DpCase{"deepseek_v3", 4, true}, DpCase{"kimi_k25_hf", 2},
                                           DpCase{"deepseek_v32", 2},
                                           DpCase{"glm_moe_dsa", 2, true},
                                           DpCase{"deepseek_v3", 2, true, 2}),
                         dp_case_name);

// Three prompts on pages of two data-parallel groups' caches (8 pages of 4 tokens each), the groups
// of one rank or of two tensor-parallel ranks: the step's logits are one rank's (the sequences'
// attention whole on their group), and each rank's latent cache holds its group's sequences' rows,
// as one rank's cache holds them at the same pages, and nothing else.
TEST(EngineDpRunner, LogitsMatchOneRankAndEachRankCachesOnlyItsSequences) {
  const std::string name = "deepseek_v3";
  Model& solo = fixture_model(name);
  const int bs = 4, P = 8;
  Batch b;
  b.block_size = bs;
  b.query_start = {0};
  b.page_indptr = {0};
  // (length, first page): group 0 holds pages 0-7, group 1 pages 8-15.
  const std::vector<std::pair<int, int>> seqs = {{7, 9}, {6, 2}, {5, 12}};
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto [n, page] = seqs[s];
    for (int i = 0; i < n; ++i) {
      b.token_ids.push_back(static_cast<int32_t>(3 + (37 * i + 11 * s) % 200));
      b.positions.push_back(i);
      b.slot_mapping.push_back((page + i / bs) * bs + i % bs);
    }
    b.query_start.push_back(b.query_start.back() + n);
    b.context_lens.push_back(n);
    for (int p = 0; p < (n + bs - 1) / bs; ++p) b.page_indices.push_back(page + p);
    b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
    b.logits_indices.push_back(b.query_start.back() - 1);
  }
  Batch one_batch;
  one_batch.copy_host_from(b);
  ModelRunner one(solo, 2 * P, bs);
  const Tensor want = one.execute(one_batch);
  const int layers = static_cast<int>(solo.config().num_hidden_layers);
  const std::string kv_b = "model.layers.0.self_attn.kv_b_proj.weight";
  for (int tp : {1, 2}) {
    SCOPED_TRACE("groups of " + std::to_string(tp));
    auto models = dp_model(name, 2, true, tp);
    // A group's ranks split MLA's heads (kv_b_proj [H (nope + v), L]): one rank holds them all.
    for (int r = 0; r < 2 * tp; ++r) {
      Shape shape = solo.params().find(kv_b)->data().shape();
      shape[0] /= tp;
      EXPECT_EQ(models->model(r).params().find(kv_b)->data().shape(), shape) << "rank " << r;
    }
    RunnerOptions o;
    o.block_size = bs;
    o.num_pages = P;
    o.max_model_len = P * bs;
    TpRunner runner(*models, o);
    EXPECT_EQ(runner.num_pages(), 2 * P);
    EXPECT_EQ(runner.page_partitions(), 2);
    Batch step;
    step.copy_host_from(b);
    const Tensor got = runner.execute(step);
    expect_logits_near(got, want, kTpLogitTolerance, "dp 2 vs one rank");
    for (int r = 0; r < 2 * tp; ++r) {
      const int g = r / tp;  // the group, and the partition of pages its ranks hold
      const KvCache& kv = runner.rank(r).kv();
      ASSERT_EQ(kv.num_pages, P) << "rank " << r;
      ASSERT_EQ(static_cast<int>(kv.planes.size()), layers);
      for (int l = 0; l < layers; ++l) {
        const Tensor mine = kv.planes[static_cast<size_t>(l)][0];
        const Tensor all = one.kv().planes[static_cast<size_t>(l)][0];
        const int64_t row = mine.numel() / (P * bs);
        for (int p = 0; p < P; ++p)
          for (int t = 0; t < bs; ++t) {
            const float* m = mine.ptr<float>() + (p * bs + t) * row;
            const float* a = all.ptr<float>() + ((g * P + p) * bs + t) * row;
            bool written = false;
            for (size_t s = 0; s < seqs.size(); ++s)
              written |= g * P + p >= seqs[s].second &&
                         (g * P + p - seqs[s].second) * bs + t < seqs[s].first;
            double norm = 0, diff = 0;
            for (int64_t c = 0; c < row; ++c) {
              norm = std::max(norm, std::abs(static_cast<double>(a[c])));
              diff = std::max(diff, std::abs(static_cast<double>(m[c]) - a[c]));
            }
            if (written) {
              ASSERT_GT(norm, 0.0) << "layer " << l << " rank " << r << " page " << p;
              ASSERT_LE(diff, 1e-5 * std::max(1.0, norm))
                  << "layer " << l << " rank " << r << " page " << p << " row " << t;
            } else {
              for (int64_t c = 0; c < row; ++c)
                ASSERT_EQ(m[c], 0.0f) << "rank " << r << " wrote page " << p << " of another";
            }
          }
      }
    }
  }
}

TEST(EngineDpErrors, ClearMessages) {
  // Models whose attention cannot run data-parallel are refused by name.
  EXPECT_ERROR_CONTAINS(dp_model("llama3_gqa", 2),
                        "LlamaForCausalLM runs attention tensor-parallel only "
                        "(--data-parallel-size 2)");
  ModelOptions pp;
  pp.data_parallel_attention = true;
  pp.pp_size = 2;
  EXPECT_ERROR_CONTAINS(model_group_load(fixture_dir("deepseek_v2_lite"), pp, 2),
                        "data-parallel attention within pipeline stages is not supported yet");
  EXPECT_ERROR_CONTAINS(
      dp_model("deepseek_v3", 2, false, 3),
      "num_attention_heads (4) must be a positive multiple of the tensor-parallel size 3");
  ModelOptions gpu;
  gpu.data_parallel_attention = true;
  gpu.device = Device::cuda(0);
  EXPECT_ERROR_CONTAINS(model_group_load(fixture_dir("deepseek_v2_lite"), gpu, 2),
                        "data-parallel attention runs on CPU ranks only so far");
}

}  // namespace
}  // namespace atom::test
