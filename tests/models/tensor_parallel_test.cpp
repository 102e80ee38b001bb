// Tensor parallelism simulated on the CPU: each rank is a thread with its own model holding only
// its shards, collectives go through a LocalGroup, and the combined result must reproduce the
// single-rank logits (and so transformers').
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <thread>

#include "common/fixtures.h"
#include "common/layer_context.h"
#include "common/test_util.h"
#include "engine/sequence_runner.h"
#include "layers/moe.h"
#include "models/loading.h"

namespace atom::test {
namespace {

struct Case {
  std::string fixture;
  int tp;
};

// What one rank made: its logits, the bytes of its parameters (and of its expert-parallel ones,
// by name) and its load report.
struct RankResult {
  Tensor logits;
  size_t weight_bytes = 0;
  std::map<std::string, size_t> expert_bytes;
  LoadReport report;
};

// Runs job(r, options of rank r) on `ranks` CPU ranks at once (threads sharing a LocalGroup);
// each rank's options are `base` with its rank, the size and its communicator. Returns each rank's
// error ("" when it finished).
std::vector<std::string> on_ranks(int ranks, const ModelOptions& base,
                                  const std::function<void(int, const ModelOptions&)>& job) {
  LocalGroup group(ranks);
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        auto comm = group.communicator(r);
        ModelOptions o = base;
        o.tp_rank = r;
        o.tp_size = ranks;
        o.comm = comm.get();
        job(r, o);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// Loads `name` on `ranks` CPU ranks and scores the reference's tokens on each; fails the test on
// any rank's error.
std::vector<RankResult> run_ranks(const std::string& name, int ranks, bool expert_parallel,
                                  const std::vector<int32_t>& ids, int redundant = 0) {
  std::vector<RankResult> got(ranks);
  ModelOptions base;
  base.expert_parallel = expert_parallel;
  base.num_redundant_experts = redundant;
  const std::vector<std::string> errors = on_ranks(ranks, base, [&](int r, const ModelOptions& o) {
    LoadedModel m = model_load(fixture_dir(name), o);
    for (const auto& [n, p] : m.model->params().all()) {
      got[r].weight_bytes += p->data().nbytes();
      // The expert-parallel [slots, ...] tensors (not an FP8 layer's placeholder scale).
      if (p->holds_expert && p->data().dim() >= 2) got[r].expert_bytes[n] += p->data().nbytes();
    }
    got[r].report = m.report;
    got[r].logits = score_tokens(*m.model, ids);
  });
  for (int r = 0; r < ranks; ++r)
    EXPECT_TRUE(errors[r].empty()) << "rank " << r << ": " << errors[r];
  return got;
}

class TensorParallel : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallel, ShardedRanksReproduceSingleRankLogits) {
  const auto [name, tp] = GetParam();
  const Reference ref = reference_load(name);
  LoadedModel solo = model_load(fixture_dir(name), {});
  const Tensor want = score_tokens(*solo.model, ref.input_ids);

  const std::vector<RankResult> got = run_ranks(name, tp, false, ref.input_ids);
  if (HasFailure()) return;
  for (int r = 0; r < tp; ++r) {
    expect_logits_near(got[r].logits, want, tp_logit_tolerance(name), "rank " + std::to_string(r));
    expect_cpu_parity(got[r].logits, ref.logits, name,
                      "rank " + std::to_string(r) + " vs transformers");
  }
  // Each rank holds a shard, not a copy: well under the full weights.
  size_t full = 0;
  for (const auto& [n, p] : solo.model->params().all()) full += p->data().nbytes();
  EXPECT_LT(got[0].weight_bytes, full * 3 / 4);
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
                      Case{"deepseek_v3_fp8_partial", 2},
                      // Kimi delta attention's heads split (conv weights and states, A_log,
                      // dt_bias cut by head), beside MLA's and the MoE's shards.
                      Case{"kimi_linear", 2}, Case{"kimi_linear_moonshot", 4},
                      // The gated delta net's key heads split with their value heads, from
                      // Qwen3-Next's per-key-head layout and Qwen3.5's separate projections.
                      Case{"qwen3_next", 2}, Case{"qwen3_5", 2}, Case{"qwen3_5_moe", 2},
                      // Replicated attention and hyper-connections, split experts (V4); KDA and
                      // MLA heads split, replicated k-pool indexer (GLM-5.3).
                      Case{"deepseek_v4", 2}, Case{"glm5_next", 2}, Case{"glm5_next", 4},
                      // Kimi-K3: the latent MoE's routed sum reduced before its norm, the shared
                      // experts apart; the gated MLA and full-rank KDA gates split by head.
                      Case{"kimi_k3", 2}),
    [](const auto& info) { return info.param.fixture + "_tp" + std::to_string(info.param.tp); });

// Expert parallelism: the same ranks split the routed experts instead of slicing each one.
struct EpCase {
  std::string fixture;
  int ranks;
  // The checkpoint stores one tensor per expert part (a rank then leaves the others' unread);
  // false: stacked tensors of every expert, read whole and cut.
  bool per_expert;
  const char* loader_threads;  // ATOM_LOADER_NUM_THREADS: "1" writes experts one by one, more
                               // stages them (loader/expert_staging.h)
  int redundant = 0;           // EPLB's redundant experts (copies over the ranks)
};

class ExpertParallel : public ::testing::TestWithParam<EpCase> {};

TEST_P(ExpertParallel, RanksHoldingWholeExpertsReproduceSingleRankLogits) {
  const EpCase c = GetParam();
  ::setenv("ATOM_LOADER_NUM_THREADS", c.loader_threads, 1);
  const Reference ref = reference_load(c.fixture);
  LoadedModel solo = model_load(fixture_dir(c.fixture), {});
  const Tensor want = score_tokens(*solo.model, ref.input_ids);
  const std::vector<RankResult> got =
      run_ranks(c.fixture, c.ranks, true, ref.input_ids, c.redundant);
  ::unsetenv("ATOM_LOADER_NUM_THREADS");
  if (HasFailure()) return;
  std::map<std::string, size_t> expert_bytes;  // summed over the ranks
  for (int r = 0; r < c.ranks; ++r) {
    const std::string who = "rank " + std::to_string(r);
    expect_logits_near(got[r].logits, want, kTpLogitTolerance, who);
    expect_logits_near(got[r].logits, ref.logits, kCpuLogitTolerance, who + " vs transformers");
    EXPECT_FALSE(got[r].expert_bytes.empty()) << who << " holds no expert-parallel parameter";
    for (const auto& [n, b] : got[r].expert_bytes) expert_bytes[n] += b;
    // A rank reads what one rank reads, less the experts the others hold, which it never reads.
    const LoadReport& rep = got[r].report;
    EXPECT_EQ(rep.checkpoint.bytes_read + rep.bytes_other_ranks, solo.report.checkpoint.bytes_read)
        << who;
    if (c.per_expert) {
      EXPECT_GT(rep.tensors_other_ranks, 0) << who;
      EXPECT_LT(rep.checkpoint.bytes_read, solo.report.checkpoint.bytes_read) << who;
    } else {
      EXPECT_EQ(rep.tensors_other_ranks, 0) << who;
    }
  }
  // The ranks' experts partition the layer's: together exactly one copy of each (no slice of
  // every expert on every rank, no expert on two ranks), plus the redundant copies.
  for (const auto& [n, b] : expert_bytes) {
    const Parameter* p = solo.model->params().find(n);
    ASSERT_NE(p, nullptr) << n;
    const int64_t E = p->data().size(0);
    EXPECT_EQ(b, p->data().nbytes() / E * (E + c.redundant)) << n;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, ExpertParallel,
    ::testing::Values(
        EpCase{"qwen3_moe", 2, true, "16"}, EpCase{"qwen3_moe", 4, true, "1"},
        EpCase{"qwen3_moe_stacked", 2, false, "16"}, EpCase{"mixtral", 2, true, "1"},
        EpCase{"glm4_moe", 4, true, "16"},        // shared experts stay tensor-parallel
        EpCase{"gpt_oss_mxfp4", 2, false, "16"},  // MXFP4 experts, expert biases, sinks
        EpCase{"gpt_oss", 2, false, "16"},
        EpCase{"deepseek_v2_lite", 2, true, "16"},  // MLA heads split, experts whole
        EpCase{"deepseek_v3", 4, true, "16"},       // grouped routing
        EpCase{"deepseek_v3_fp8", 2, true, "16"},   // FP8 experts with their scales
        EpCase{"deepseek_v4", 2, true, "16"},       // hash and sqrt-softplus routing
        // EPLB's redundant experts: physical p a copy of p % E, rank r holding (E + R) / ranks
        EpCase{"qwen3_moe", 2, true, "16", 2}, EpCase{"qwen3_moe", 4, true, "1", 4},
        EpCase{"deepseek_v3", 4, true, "16", 4}, EpCase{"gpt_oss_mxfp4", 2, false, "16", 2},
        EpCase{"mixtral", 2, false, "16", 8}),  // every rank a copy of every expert
    [](const auto& info) {
      return info.param.fixture + "_ep" + std::to_string(info.param.ranks) + "_threads" +
             info.param.loader_threads +
             (info.param.redundant ? "_redundant" + std::to_string(info.param.redundant) : "");
    });

// DeepSeek-V4.1 (CSA2: layers 3 and 4 read layer 2's compressed rows, layer 4 layer 3's top-k,
// both layer 2's candidate blocks; Engram on layer 1) over 2 ranks, the experts sliced or whole:
// the attention, compressors, indexers and Engram are replicated, so every rank holds every
// layer's cache rows; the routed and shared experts split and reduce once. Each rank's logits are
// the single rank's within 1e-5 of the largest.
TEST(TensorParallelDeepseekV41, RanksReproduceSingleRankLogits) {
  const Reference ref = reference_load("deepseek_v41");
  LoadedModel solo = model_load(fixture_dir("deepseek_v41"), {});
  const Tensor want = score_tokens(*solo.model, ref.input_ids);
  for (const bool ep : {false, true}) {
    SCOPED_TRACE(ep ? "expert parallel" : "tensor parallel");
    const std::vector<RankResult> got = run_ranks("deepseek_v41", 2, ep, ref.input_ids);
    if (HasFailure()) return;
    for (int r = 0; r < 2; ++r) {
      const double rel = max_rel_diff(got[r].logits, want);
      std::printf("deepseek_v41 %s 2, rank %d: max |Δlogit| / max |logit| vs one rank %.3g\n",
                  ep ? "ep" : "tp", r, rel);
      EXPECT_LE(rel, 1e-5) << "rank " << r;
      EXPECT_EQ(got[r].expert_bytes.empty(), !ep) << "rank " << r;
    }
  }
}

TEST(ExpertParallelErrors, MoreRanksThanExpertsIsAClearError) {
  ParamRegistry params;
  TestLayerContext rig(params, /*tp_rank=*/1, /*tp_size=*/8);
  LayerContext& ctx = rig.ctx;
  ctx.expert_parallel = true;
  FusedMoEOptions o;
  o.num_experts = 4;
  o.hidden = 8;
  o.intermediate = 8;
  EXPECT_ERROR_CONTAINS(FusedMoE(ctx, "model.layers.0.mlp.experts", o),
                        "expert parallelism over 8 ranks needs at least 8 routed experts");
}

// Every rank of a load of `name` over `ranks` CPU ranks fails with an error containing `what`.
void expect_every_rank_fails(const std::string& name, int ranks, const ModelOptions& base,
                             const std::string& what) {
  const std::vector<std::string> errors =
      on_ranks(ranks, base, [&](int, const ModelOptions& o) { model_load(fixture_dir(name), o); });
  for (int r = 0; r < ranks; ++r)
    EXPECT_NE(errors[r].find(what), std::string::npos) << "rank " << r << ": " << errors[r];
}

TEST(ExpertParallelErrors, RedundantExpertsMustSplitEvenly) {
  ModelOptions base;
  base.expert_parallel = true;
  base.num_redundant_experts = 2;  // 8 + 2 over 4 ranks
  expect_every_rank_fails("qwen3_moe", 4, base,
                          "8 experts plus 2 redundant ones do not split evenly over 4");
}

// EPLB's re-placement on CPU ranks: the router counted every routed choice of the scored tokens on
// every rank alike; rebalancing moves slots between ranks (weights fetched from their holders)
// and clears the count; the logits stay the single rank's, and a second pass counts again.
TEST(ExpertParallel, RebalancedExpertsGiveTheSameLogits) {
  const Reference ref = reference_load("qwen3_moe");
  LoadedModel solo = model_load(fixture_dir("qwen3_moe"), {});
  const Tensor want = score_tokens(*solo.model, ref.input_ids);
  const int ranks = 2;
  std::vector<Tensor> before(ranks), after(ranks);
  std::vector<int> moved(ranks, 0);
  std::vector<std::vector<int64_t>> loads(ranks), placement_before(ranks), placement_after(ranks);
  ModelOptions base;
  base.expert_parallel = true;
  base.num_redundant_experts = 2;
  const std::vector<std::string> errors = on_ranks(ranks, base, [&](int r, const ModelOptions& o) {
    LoadedModel m = model_load(fixture_dir("qwen3_moe"), o);
    const auto& layers = m.model->eplb_layers();
    if (layers.empty()) throw Error("no EPLB layer");
    before[r] = score_tokens(*m.model, ref.input_ids);
    FusedMoE& first = *layers[0];
    const Tensor l = first.expert_load().to(Device::cpu());
    loads[r].assign(l.ptr<int64_t>(), l.ptr<int64_t>() + l.numel());
    placement_before[r] = first.placement();
    moved[r] = m.model->rebalance_experts();
    placement_after[r] = first.placement();
    const Tensor cleared = first.expert_load().to(Device::cpu());
    for (int64_t e = 0; e < cleared.numel(); ++e)
      if (cleared.ptr<int64_t>()[e] != 0) throw Error("the load was not cleared");
    after[r] = score_tokens(*m.model, ref.input_ids);
  });
  for (int r = 0; r < ranks; ++r)
    ASSERT_TRUE(errors[r].empty()) << "rank " << r << ": " << errors[r];
  int64_t total = 0;
  for (const int64_t v : loads[0]) total += v;
  const int64_t top_k = 2;  // qwen3_moe's num_experts_per_tok
  EXPECT_EQ(total, static_cast<int64_t>(ref.input_ids.size()) * top_k);
  EXPECT_EQ(loads[0], loads[1]) << "every rank routes every token";
  EXPECT_GT(moved[0], 0) << "a skewed load should move some layer's experts";
  EXPECT_EQ(moved[0], moved[1]);
  EXPECT_NE(placement_before[0], placement_after[0]);
  EXPECT_EQ(placement_after[0], placement_after[1]);
  for (int r = 0; r < ranks; ++r) {
    expect_logits_near(before[r], want, kTpLogitTolerance, "before, rank " + std::to_string(r));
    expect_logits_near(after[r], want, kTpLogitTolerance, "after, rank " + std::to_string(r));
  }
}

TEST(ExpertParallel, ShareIsVllmsLinearPlacement) {
  // 10 experts on 4 ranks: 3, 3, 2, 2, in order.
  const int64_t first[] = {0, 3, 6, 8}, count[] = {3, 3, 2, 2};
  for (int r = 0; r < 4; ++r) {
    const ExpertShare s = ExpertShare::of(10, r, 4);
    EXPECT_EQ(s.first, first[r]) << r;
    EXPECT_EQ(s.count, count[r]) << r;
  }
  EXPECT_TRUE(ExpertShare::of(10, 1, 4).holds(5));
  EXPECT_FALSE(ExpertShare::of(10, 1, 4).holds(6));
}

TEST(TensorParallelErrors, IndivisibleSizesAreClearErrors) {
  expect_every_rank_fails("llama3_gqa", 3, {}, "not divisible by the tensor-parallel size 3");
}

TEST(TensorParallelErrors, GatedDeltaNetKeyHeadsMustDivide) {
  // Qwen3-Next's fixture has 2 key heads (4 value heads): 4 ranks cannot split them.
  expect_every_rank_fails(
      "qwen3_next", 4, {},
      "linear_num_key_heads 2 must be a multiple of the tensor-parallel size 4");
}

}  // namespace
}  // namespace atom::test
