// Tensor parallelism simulated on the CPU: each rank is a thread with its own model holding only
// its shards, collectives go through a LocalGroup, and the combined result must reproduce the
// single-rank logits (and so transformers').
#include <gtest/gtest.h>

#include <thread>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "engine/sequence_runner.h"
#include "models/loading.h"

namespace atom::test {
namespace {

struct Case {
  std::string fixture;
  int tp;
};

class TensorParallel : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallel, ShardedRanksReproduceSingleRankLogits) {
  const auto [name, tp] = GetParam();
  const Reference ref = reference_load(name);
  LoadedModel solo = model_load(fixture_dir(name), {});
  const Tensor want = score_tokens(*solo.model, ref.input_ids);

  LocalGroup group(tp);
  std::vector<Tensor> got(tp);
  std::vector<std::string> errors(tp);
  std::vector<size_t> weight_bytes(tp, 0);
  std::vector<std::thread> ranks;
  for (int r = 0; r < tp; ++r) {
    ranks.emplace_back([&, r] {
      try {
        auto comm = group.communicator(r);
        ModelOptions o;
        o.tp_rank = r;
        o.tp_size = tp;
        o.comm = comm.get();
        LoadedModel m = model_load(fixture_dir(name), o);
        for (const auto& [n, p] : m.model->params().all()) weight_bytes[r] += p->data().nbytes();
        got[r] = score_tokens(*m.model, ref.input_ids);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < tp; ++r) {
    ASSERT_TRUE(errors[r].empty()) << "rank " << r << ": " << errors[r];
    expect_logits_near(got[r], want, kTpLogitTolerance, "rank " + std::to_string(r));
    expect_logits_near(got[r], ref.logits, kCpuLogitTolerance,
                       "rank " + std::to_string(r) + " vs transformers");
  }
  // Each rank holds a shard, not a copy: well under the full weights.
  size_t full = 0;
  for (const auto& [n, p] : solo.model->params().all()) full += p->data().nbytes();
  EXPECT_LT(weight_bytes[0], full * 3 / 4);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, TensorParallel,
    ::testing::Values(Case{"llama3_gqa", 2}, Case{"llama3_gqa", 4},  // tp 4 > 2 kv heads: replicas
                      Case{"llama_yarn_bias_legacy", 2},             // row-parallel bias added once
                      Case{"qwen3_tied", 2}, Case{"qwen3_tied", 4},  // tied head, kv replicas
                      Case{"qwen3_sliding", 2},
                      // experts split by intermediate channel, one reduction after the combine
                      Case{"qwen3_moe", 2}, Case{"qwen3_moe", 4}, Case{"qwen3_moe_stacked", 2},
                      Case{"mixtral", 2}, Case{"glm4_moe", 2},  // shared experts unreduced
                      Case{"glm4_moe_air", 4}, Case{"gpt_oss", 2},
                      Case{"gpt_oss_mxfp4", 2},  // sinks, expert biases
                      // MLA heads split over ranks, the latent (and its cache) replicated
                      Case{"deepseek_v2_lite", 2}, Case{"deepseek_v2", 4}, Case{"deepseek_v3", 2},
                      Case{"deepseek_v3", 4},
                      // the indexer replicated: every rank selects the same positions
                      Case{"deepseek_v32", 2}, Case{"glm_moe_dsa", 4},
                      // FP8 checkpoints dequantised at load, then cut (the scales' parts too)
                      Case{"llama_fp8_channel", 2}, Case{"qwen3_fp8_tensor", 2},
                      Case{"llama_fbgemm_fp8", 2}, Case{"deepseek_v3_fp8", 2},
                      Case{"deepseek_v3_fp8_partial", 2}),
    [](const auto& info) { return info.param.fixture + "_tp" + std::to_string(info.param.tp); });

TEST(TensorParallelErrors, IndivisibleSizesAreClearErrors) {
  LocalGroup group(3);
  auto comm = group.communicator(0);
  ModelOptions o;
  o.tp_size = 3;
  o.comm = comm.get();
  EXPECT_ERROR_CONTAINS(model_load(fixture_dir("llama3_gqa"), o),
                        "not divisible by the tensor-parallel size 3");
}

}  // namespace
}  // namespace atom::test
