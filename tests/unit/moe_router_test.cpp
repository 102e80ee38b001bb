// The CPU routers and fused experts against hand-derived values and an independent reference
// written here (sorting by (score desc, index asc), double precision), not against atom's output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "common/layer_context.h"
#include "common/tensor_util.h"
#include "common/test_util.h"
#include "core/convert.h"
#include "kernels/elementwise.h"
#include "kernels/moe.h"
#include "kernels/random.h"
#include "layers/moe.h"

namespace atom::test {
namespace {

using kernels::GroupScore;
using kernels::RouterArgs;
using kernels::RouterScoring;

Tensor f32(const std::vector<float>& v, Shape shape) {
  Tensor t = Tensor::empty(std::move(shape), DType::kF32);
  std::copy(v.begin(), v.end(), t.ptr<float>());
  return t;
}

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

Routed route(const std::vector<float>& logits, int64_t T, const RouterArgs& a,
             const std::vector<float>& bias = {}) {
  const int64_t E = static_cast<int64_t>(logits.size()) / T, K = a.top_k + a.num_fused_shared;
  Tensor ids = Tensor::empty({T, K}, DType::kI32), w = Tensor::empty({T, K}, DType::kF32);
  kernels::moe_route(ids, w, f32(logits, {T, E}), bias.empty() ? Tensor() : f32(bias, {E}), a);
  return {std::vector<int32_t>(ids.ptr<int32_t>(), ids.ptr<int32_t>() + T * K),
          std::vector<float>(w.ptr<float>(), w.ptr<float>() + T * K)};
}

// The independent reference: one token.
Routed reference_route(const std::vector<double>& logits, const RouterArgs& a,
                       const std::vector<double>& bias = {}) {
  const int64_t E = static_cast<int64_t>(logits.size());
  std::vector<double> score(E), choice(E);
  if (a.scoring == RouterScoring::kSoftmax) {
    double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(logits[e] - mx);
    for (int64_t e = 0; e < E; ++e) score[e] = std::exp(logits[e] - mx) / sum;
  } else if (a.scoring == RouterScoring::kSigmoid) {
    for (int64_t e = 0; e < E; ++e) score[e] = 1 / (1 + std::exp(-logits[e]));
  } else if (a.scoring == RouterScoring::kSqrtSoftplus) {
    for (int64_t e = 0; e < E; ++e) score[e] = std::sqrt(std::log(1 + std::exp(logits[e])));
  } else {
    score = logits;
  }
  for (int64_t e = 0; e < E; ++e) choice[e] = score[e] + (bias.empty() ? 0 : bias[e]);
  auto order = [](const std::vector<double>& v) {
    std::vector<int64_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t x, int64_t y) { return v[x] > v[y]; });
    return idx;
  };
  if (a.n_group > 1) {
    const int64_t per = E / a.n_group;
    std::vector<double> g(a.n_group);
    for (int64_t i = 0; i < a.n_group; ++i) {
      std::vector<double> c(choice.begin() + i * per, choice.begin() + (i + 1) * per);
      std::sort(c.rbegin(), c.rend());
      g[i] = a.group_score == GroupScore::kMax ? c[0] : c[0] + c[1];
    }
    const auto go = order(g);
    std::vector<bool> keep(a.n_group, false);
    for (int i = 0; i < a.topk_group; ++i) keep[go[i]] = true;
    for (int64_t e = 0; e < E; ++e)
      if (!keep[e / per]) choice[e] = -std::numeric_limits<double>::infinity();
  }
  const auto o = order(choice);
  Routed r;
  std::vector<double> w;
  for (int k = 0; k < a.top_k; ++k) {
    r.ids.push_back(static_cast<int32_t>(o[k]));
    w.push_back(a.scoring == RouterScoring::kTopKThenSoftmax ? choice[o[k]] : score[o[k]]);
  }
  if (a.scoring == RouterScoring::kTopKThenSoftmax) {
    double mx = w[0], sum = 0;
    for (double& v : w) sum += (v = std::exp(v - mx));
    for (double& v : w) v /= sum;
  }
  if (a.renormalize) {
    const double sum = std::accumulate(w.begin(), w.end(), 0.0);
    for (double& v : w) v /= sum;
  }
  for (double v : w) r.w.push_back(static_cast<float>(v * a.routed_scaling_factor));
  for (int s = 0; s < a.num_fused_shared; ++s) {
    r.ids.push_back(a.shared_slot_first + s);
    r.w.push_back(1.0f);
  }
  return r;
}

void expect_route(const std::vector<float>& logits, int64_t T, const RouterArgs& a,
                  const std::vector<float>& bias = {}) {
  const Routed got = route(logits, T, a, bias);
  const int64_t E = static_cast<int64_t>(logits.size()) / T, K = a.top_k + a.num_fused_shared;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double> row(logits.begin() + t * E, logits.begin() + (t + 1) * E);
    const Routed want = reference_route(row, a, std::vector<double>(bias.begin(), bias.end()));
    for (int64_t k = 0; k < K; ++k) {
      EXPECT_EQ(got.ids[t * K + k], want.ids[k]) << "token " << t << " choice " << k;
      EXPECT_NEAR(got.w[t * K + k], want.w[k], 1e-6 * std::max(1.0f, std::abs(want.w[k])))
          << "token " << t << " choice " << k;
    }
  }
}

TEST(MoeRoute, SoftmaxTopKHandDerived) {
  RouterArgs a;
  a.top_k = 2;
  // softmax([1, 3, 2, 0.5]): e^3 and e^2 over their sum with e^1 and e^0.5.
  const double z = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + std::exp(0.5);
  Routed r = route({1, 3, 2, 0.5f}, 1, a);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(r.w[0], std::exp(3.0) / z, 1e-7);
  EXPECT_NEAR(r.w[1], std::exp(2.0) / z, 1e-7);
  a.renormalize = true;
  r = route({1, 3, 2, 0.5f}, 1, a);
  EXPECT_NEAR(r.w[0], std::exp(3.0) / (std::exp(3.0) + std::exp(2.0)), 1e-7);
  EXPECT_NEAR(r.w[0] + r.w[1], 1.0, 1e-7);
}

// Expert parallelism with EPLB's replicas: each choice of expert e in token row t goes to physical
// expert replicas[e, t % count[e]], then to this rank's slot (physical - local_first) or -1; the
// weights are the plain route's, and expert_load adds every routed choice of each logical expert.
TEST(MoeRoute, ReplicasPickByTokenRowAndLoadCountsChoices) {
  const int64_t T = 50, E = 6, K = 2;
  Tensor logits = random_cpu({T, E}, DType::kF32, 77, -3.0f, 3.0f);
  RouterArgs a;
  a.scoring = RouterScoring::kSoftmax;
  a.top_k = K;
  a.renormalize = true;
  Tensor ids0 = Tensor::empty({T, K}, DType::kI32), w0 = Tensor::empty({T, K}, DType::kF32);
  kernels::moe_route(ids0, w0, logits, Tensor(), a);
  // 9 physical experts: 0..5 copies of 0..5, 6..8 copies of 0..2; this rank holds physical 3..5.
  Tensor table = Tensor::zeros({E, 3}, DType::kI32), count = Tensor::zeros({E}, DType::kI32);
  for (int64_t e = 0; e < E; ++e) {
    table.ptr<int32_t>()[e * 3] = static_cast<int32_t>(e);
    count.ptr<int32_t>()[e] = e < 3 ? 2 : 1;
    if (e < 3) table.ptr<int32_t>()[e * 3 + 1] = static_cast<int32_t>(e + 6);
  }
  Tensor load = Tensor::zeros({E}, DType::kI64);
  RouterArgs b = a;
  b.replicas = &table;
  b.replica_count = &count;
  b.expert_load = &load;
  b.local_first = 3;
  b.local_count = 3;
  Tensor ids = Tensor::empty({T, K}, DType::kI32), w = Tensor::empty({T, K}, DType::kF32);
  kernels::moe_route(ids, w, logits, Tensor(), b);
  std::vector<int64_t> want_load(E, 0);
  int local = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = ids0.ptr<int32_t>()[t * K + k];
      ++want_load[e];
      const int32_t phys = e < 3 && t % 2 == 1 ? e + 6 : e;
      const int32_t want = phys >= 3 && phys < 6 ? phys - 3 : -1;
      EXPECT_EQ(ids.ptr<int32_t>()[t * K + k], want) << "t " << t << " k " << k << " e " << e;
      EXPECT_EQ(w.ptr<float>()[t * K + k], w0.ptr<float>()[t * K + k]);
      local += want >= 0;
    }
  EXPECT_GT(local, 0);
  EXPECT_LT(local, T * K);
  for (int64_t e = 0; e < E; ++e) EXPECT_EQ(load.ptr<int64_t>()[e], want_load[e]) << e;
}

// EPLB's re-placement on a hand-worked load: 8 experts, 4 redundant copies, 4 ranks of 3 slots.
// Copies go to the most load per copy (1000 -> 500, tie with 500: lower index -> 333 -> 7's 500 ->
// 0's 333): expert 0 four copies, 7 two, the rest one; the six shares of 250 spread over the ranks
// (no rank two copies of one expert), the small ones fill the least loaded ranks.
TEST(Eplb, PlacementGivesHotExpertsCopiesAndSpreadsThem) {
  const std::vector<int64_t> load = {1000, 10, 10, 10, 10, 10, 10, 500};
  std::vector<int64_t> current;
  for (int64_t p = 0; p < 12; ++p) current.push_back(p % 8);
  const std::vector<int64_t> next = eplb_placement(load, 4, 4, current);
  ASSERT_EQ(next.size(), 12u);
  std::vector<int> copies(8, 0);
  std::vector<double> rank_load(4, 0.0);
  for (int64_t p = 0; p < 12; ++p) ++copies[next[p]];
  EXPECT_EQ(copies, (std::vector<int>{4, 1, 1, 1, 1, 1, 1, 2}));
  for (int r = 0; r < 4; ++r) {
    std::vector<int64_t> on(next.begin() + 3 * r, next.begin() + 3 * r + 3);
    for (const int64_t e : on) rank_load[r] += static_cast<double>(load[e]) / copies[e];
    std::sort(on.begin(), on.end());
    EXPECT_EQ(std::unique(on.begin(), on.end()), on.end()) << "rank " << r << " holds a copy twice";
  }
  // The greedy's result worked by hand: 510, 510, 270, 270.
  std::sort(rank_load.begin(), rank_load.end());
  EXPECT_DOUBLE_EQ(rank_load[0], 270.0);
  EXPECT_DOUBLE_EQ(rank_load[3], 510.0);
  // An expert that stays on a rank keeps its slot: rank 0 held 0, 1, 2 and keeps 0 in slot 0.
  EXPECT_EQ(next[0], 0);
  EXPECT_THROW(eplb_placement(load, 3, 4, current), Error);  // 11 copies over 4 ranks
  // Balancedness, mean over max rank load: 390 / 510 after; before (p % 8: experts 0..3 two
  // copies each) the ranks hold 500 + 5 + 5, 5 + 10 + 10, 10 + 500 + 500 and 5 + 5 + 5: 390 / 1010.
  EXPECT_DOUBLE_EQ(eplb_balancedness(load, 4, next), 390.0 / 510.0);
  EXPECT_DOUBLE_EQ(eplb_balancedness(load, 4, current), 390.0 / 1010.0);
}

TEST(MoeRoute, TiesGoToTheLowerIndex) {
  RouterArgs a;
  a.top_k = 1;
  EXPECT_EQ(route({2, 5, 5, 1}, 1, a).ids, (std::vector<int32_t>{1}));
  a.top_k = 3;
  EXPECT_EQ(route({7, 7, 7, 7, 7}, 1, a).ids, (std::vector<int32_t>{0, 1, 2}));
  a.scoring = RouterScoring::kSigmoid;
  a.top_k = 2;
  // Sigmoid + bias ties on the choice: 0.5 + 0.25 for experts 1 and 3.
  EXPECT_EQ(route({0, 0, -10, 0}, 1, a, {0, 0.25f, 0, 0.25f}).ids, (std::vector<int32_t>{1, 3}));
}

TEST(MoeRoute, NanLogitsStillGiveValidDistinctSlots) {
  RouterArgs a;
  a.top_k = 3;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto sc :
       {RouterScoring::kSoftmax, RouterScoring::kSigmoid, RouterScoring::kTopKThenSoftmax}) {
    a.scoring = sc;
    const Routed r = route({nan, nan, nan, nan, nan, 1, nan, 2}, 1, a);
    std::vector<int32_t> s = r.ids;
    std::sort(s.begin(), s.end());
    EXPECT_TRUE(std::adjacent_find(s.begin(), s.end()) == s.end());
    for (int32_t id : r.ids) EXPECT_TRUE(id >= 0 && id < 8) << id;
  }
}

TEST(MoeRoute, EveryVariantMatchesTheReference) {
  // 37 tokens of 16 experts, seeded.
  Tensor l = random_cpu({37, 16}, DType::kF32, 11, -3, 3);
  const std::vector<float> logits(l.ptr<float>(), l.ptr<float>() + l.numel());
  Tensor b = random_cpu({16}, DType::kF32, 12, -0.3f, 0.3f);
  const std::vector<float> bias(b.ptr<float>(), b.ptr<float>() + 16);
  RouterArgs a;
  a.top_k = 4;
  expect_route(logits, 37, a);
  a.renormalize = true;
  expect_route(logits, 37, a);
  a.scoring = RouterScoring::kTopKThenSoftmax;  // GPT-OSS
  a.renormalize = false;
  expect_route(logits, 37, a);
  a.scoring = RouterScoring::kSigmoid;  // DeepSeek-V3 / GLM-4.5
  a.renormalize = true;
  a.routed_scaling_factor = 2.5f;
  expect_route(logits, 37, a, bias);
  a.n_group = 4;
  a.topk_group = 2;
  expect_route(logits, 37, a, bias);
  a.group_score = GroupScore::kMax;  // DeepSeek-V2's group-limited greedy
  a.scoring = RouterScoring::kSoftmax;
  a.routed_scaling_factor = 1.0f;
  expect_route(logits, 37, a);
  a.num_fused_shared = 2;  // shared experts fused as slots 16 and 17, weight 1
  a.shared_slot_first = 16;
  expect_route(logits, 37, a);
  a = RouterArgs{};  // DeepSeek-V4: sqrt(softplus), correction bias, renormalised and scaled
  a.scoring = RouterScoring::kSqrtSoftplus;
  a.top_k = 6;
  a.renormalize = true;
  a.routed_scaling_factor = 1.5f;
  expect_route(logits, 37, a, bias);
}

// DeepSeek-V4's hash layers: the experts come from the table (even the lowest scored), the
// weights from the sqrt-softplus scores of those experts, renormalised and scaled.
TEST(MoeRoute, FixedIdsChooseTheExpertsAndScoresWeighThem) {
  RouterArgs a;
  a.scoring = RouterScoring::kSqrtSoftplus;
  a.top_k = 2;
  a.renormalize = true;
  a.routed_scaling_factor = 1.5f;
  Tensor fixed = Tensor::empty({2, 2}, DType::kI32);
  const int32_t ids[] = {3, 0, 1, 2};
  std::copy(ids, ids + 4, fixed.ptr<int32_t>());
  a.fixed_ids = &fixed;
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f, -2.0f, 0.0f, 3.0f, 1.0f};
  const Routed r = route(logits, 2, a);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 0, 1, 2}));
  auto s = [](double x) { return std::sqrt(std::log(1 + std::exp(x))); };
  EXPECT_NEAR(r.w[0], 1.5 * s(-1.0) / (s(-1.0) + s(2.0)), 1e-6);
  EXPECT_NEAR(r.w[1], 1.5 * s(2.0) / (s(-1.0) + s(2.0)), 1e-6);
  EXPECT_NEAR(r.w[2], 1.5 * s(0.0) / (s(0.0) + s(3.0)), 1e-6);
  EXPECT_NEAR(r.w[3], 1.5 * s(3.0) / (s(0.0) + s(3.0)), 1e-6);
  fixed.ptr<int32_t>()[3] = 4;  // not one of the 4 experts
  EXPECT_ERROR_CONTAINS(route(logits, 2, a), "fixed expert 4 of token row 1 is not one of the 4");
}

TEST(MoeRoute, GroupLimitHandDerived) {
  // 4 experts in 2 groups, keep 1: group {0,1} scores 0.9+0.1 = 1.0, group {2,3} 0.6+0.6 = 1.2,
  // so expert 0 (the best single score) is not chosen.
  RouterArgs a;
  a.scoring = RouterScoring::kSigmoid;
  a.top_k = 2;
  a.n_group = 2;
  a.topk_group = 1;
  auto logit = [](double p) { return static_cast<float>(std::log(p / (1 - p))); };
  const Routed r = route({logit(0.9), logit(0.1), logit(0.6), logit(0.6)}, 1, a);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3}));
  EXPECT_NEAR(r.w[0], 0.6, 1e-6);
}

TEST(MoeRoute, DroppedGroupsLoseEvenToNegativeChoices) {
  // Sigmoid scores 0.3, 0.2 | 0.1, 0.1 with correction biases -0.5, -0.5 | -0.5, -0.7: choices
  // -0.2, -0.3 | -0.4, -0.6. Group 0 scores -0.5, group 1 -1.0: group 0 is kept, and both picks
  // come from it although their choices are negative (transformers masks the dropped group's
  // experts to -inf; a mask of 0 would pick experts 2 and 3).
  RouterArgs a;
  a.scoring = RouterScoring::kSigmoid;
  a.top_k = 2;
  a.n_group = 2;
  a.topk_group = 1;
  auto logit = [](double p) { return static_cast<float>(std::log(p / (1 - p))); };
  const Routed r =
      route({logit(0.3), logit(0.2), logit(0.1), logit(0.1)}, 1, a, {-0.5f, -0.5f, -0.5f, -0.7f});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
}

TEST(MoeRoute, BadArgumentsAreErrors) {
  RouterArgs a;
  a.top_k = 5;
  EXPECT_ERROR_CONTAINS(route({1, 2, 3, 4}, 1, a), "top_k 5 for 4 experts");
  a.top_k = 1;
  a.n_group = 3;
  EXPECT_ERROR_CONTAINS(route({1, 2, 3, 4}, 1, a), "4 experts in 3 groups");
  a.n_group = 1;
  EXPECT_ERROR_CONTAINS(route({1, 2, 3, 4}, 1, a, {0, 0, 0, 0}),
                        "needs sigmoid or sqrt-softplus scoring");
}

// out[t, h] = Σ_j w_j · W2[e] silu(W1[e] x) * (W3[e] x), e = ids[t, j], in double, from F32
// weights [E, 2I, H] and [E, H, I]. limit > 0: silu(min(g, limit)) * clamp(u, ±limit), and
// *clamped counts the products a clamp changed.
std::vector<double> direct_moe(const Tensor& x, const Tensor& w13, const Tensor& w2,
                               const Tensor& ids, const Tensor& w, double limit = 0,
                               int* clamped = nullptr,
                               const std::function<double(double, double)>& act = nullptr) {
  const int64_t T = x.size(0), H = x.size(1), I = w2.size(2), K = ids.size(1);
  std::vector<double> want(static_cast<size_t>(T * H), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < K; ++j) {
        const int64_t e = ids.ptr<int32_t>()[t * K + j];
        double y = 0;
        for (int64_t i = 0; i < I; ++i) {
          double g = 0, u = 0;
          for (int64_t c = 0; c < H; ++c) {
            g += w13.ptr<float>()[(e * 2 * I + i) * H + c] * x.ptr<float>()[t * H + c];
            u += w13.ptr<float>()[(e * 2 * I + I + i) * H + c] * x.ptr<float>()[t * H + c];
          }
          if (limit > 0) {
            if (clamped) *clamped += (g > limit) + (std::abs(u) > limit);
            g = std::min(g, limit);
            u = std::clamp(u, -limit, limit);
          }
          y +=
              w2.ptr<float>()[(e * H + h) * I + i] * (act ? act(g, u) : g / (1 + std::exp(-g)) * u);
        }
        want[static_cast<size_t>(t * H + h)] += w.ptr<float>()[t * K + j] * y;
      }
  return want;
}

TEST(FusedMoe, CpuMatchesADirectSumAndPaddingAddsNothing) {
  const int64_t T = 5, E = 4, K = 3, H = 16, I = 12, Ip = 16;
  for (const DType wt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(wt));
    Tensor x = random_cpu({T, H}, DType::kF32, 1);
    Tensor w13 = random_cpu({E, 2 * I, H}, wt, 2, -0.5f, 0.5f);
    Tensor w2 = random_cpu({E, H, I}, wt, 3, -0.5f, 0.5f);
    Tensor ids = i32({0, 2, 3, 1, 1, 0, 3, 2, 1, 2, 2, 3, 0, 3, 1});
    ids = ids.view({T, K});
    Tensor w = random_cpu({T, K}, DType::kF32, 4, 0, 1);
    Tensor out = Tensor::empty({T, H}, DType::kF32);
    kernels::MoeExperts ex;
    ex.w13 = &w13;
    ex.w2 = &w2;
    kernels::fused_moe(out, x, ex, ids, w, nullptr);
    const std::vector<double> want =
        direct_moe(x, tensor_cast_cpu(w13, DType::kF32), tensor_cast_cpu(w2, DType::kF32), ids, w);
    for (int64_t i = 0; i < T * H; ++i)
      EXPECT_NEAR(out.ptr<float>()[i], want[i], 1e-5 * std::max(1.0, std::abs(want[i])));
    // The same experts with I padded to 16 by zero rows (gate, up) and columns (down).
    Tensor p13 = Tensor::zeros({E, 2 * Ip, H}, wt), p2 = Tensor::zeros({E, H, Ip}, wt);
    for (int64_t e = 0; e < E; ++e) {
      for (int half = 0; half < 2; ++half) {
        Tensor dst = p13.select(0, e).narrow(0, half * Ip, I);
        dst.copy_from(w13.select(0, e).narrow(0, half * I, I).contiguous());
      }
      for (int64_t h = 0; h < H; ++h) {
        Tensor dst = p2.select(0, e).select(0, h).narrow(0, 0, I);
        dst.copy_from(w2.select(0, e).select(0, h));
      }
    }
    Tensor padded = Tensor::empty({T, H}, DType::kF32);
    ex.w13 = &p13;
    ex.w2 = &p2;
    kernels::fused_moe(padded, x, ex, ids, w, nullptr);
    // Zero terms change only the order of the dot product's partial sums (8 lanes over 16
    // channels instead of 8 + a tail of 4): fp32 rounding, not a different value.
    for (int64_t i = 0; i < T * H; ++i)
      EXPECT_NEAR(padded.ptr<float>()[i], out.ptr<float>()[i],
                  1e-6f * std::max(1.0f, std::abs(out.ptr<float>()[i])));
    // A slot past the layer is an error, not a read out of bounds.
    ids.ptr<int32_t>()[4] = 4;
    EXPECT_ERROR_CONTAINS(kernels::fused_moe(out, x, ex, ids, w, nullptr), "chose slot 4 of 4");
  }
}

// DeepSeek-V4's clamped SiLU-mul: silu(min(g, limit)) * clamp(u, -limit, limit), in double,
// with a limit most products pass (so the clamps act on both sides).
TEST(FusedMoe, ClampedSiluMulMatchesADirectSum) {
  const int64_t T = 3, E = 2, K = 2, H = 8, I = 6;
  const float limit = 0.3f;
  Tensor x = random_cpu({T, H}, DType::kF32, 21);
  Tensor w13 = random_cpu({E, 2 * I, H}, DType::kF32, 22, -0.5f, 0.5f);
  Tensor w2 = random_cpu({E, H, I}, DType::kF32, 23, -0.5f, 0.5f);
  Tensor ids = i32({0, 1, 1, 0, 0, 1}).view({T, K});
  Tensor w = random_cpu({T, K}, DType::kF32, 24, 0, 1);
  Tensor out = Tensor::empty({T, H}, DType::kF32);
  kernels::MoeExperts ex;
  ex.w13 = &w13;
  ex.w2 = &w2;
  ex.activation = kernels::Glu::silu_clamped(limit);
  kernels::fused_moe(out, x, ex, ids, w, nullptr);
  int clamped = 0;
  const std::vector<double> want = direct_moe(x, w13, w2, ids, w, limit, &clamped);
  for (int64_t i = 0; i < T * H; ++i)
    EXPECT_NEAR(out.ptr<float>()[i], want[i], 1e-5 * std::max(1.0, std::abs(want[i])));
  EXPECT_GT(clamped, 20) << "the limit should clamp many products";
}

// Kimi-K3's SiTU, beta tanh(g / beta) sigmoid(g) times up or linear_beta tanh(up / linear_beta),
// written here in double from its definition, with betas the products cross (so both caps act),
// on the experts and on the dense form (kernels::glu).
TEST(FusedMoe, SituMatchesADirectSum) {
  const int64_t T = 3, E = 2, K = 2, H = 8, I = 6;
  Tensor x = random_cpu({T, H}, DType::kF32, 31, -2, 2);
  Tensor w13 = random_cpu({E, 2 * I, H}, DType::kF32, 32, -0.5f, 0.5f);
  Tensor w2 = random_cpu({E, H, I}, DType::kF32, 33, -0.5f, 0.5f);
  Tensor ids = i32({0, 1, 1, 0, 0, 1}).view({T, K});
  Tensor w = random_cpu({T, K}, DType::kF32, 34, 0, 1);
  for (const float lb : {0.0f, 0.5f}) {
    SCOPED_TRACE(lb);
    const double beta = 0.4;
    auto situ = [&](double g, double u) {
      const double ul = lb > 0 ? lb * std::tanh(u / lb) : u;
      return beta * std::tanh(g / beta) / (1 + std::exp(-g)) * ul;
    };
    kernels::MoeExperts ex;
    ex.w13 = &w13;
    ex.w2 = &w2;
    ex.activation = kernels::Glu::situ(static_cast<float>(beta), lb);
    Tensor out = Tensor::empty({T, H}, DType::kF32);
    kernels::fused_moe(out, x, ex, ids, w, nullptr);
    const std::vector<double> want = direct_moe(x, w13, w2, ids, w, 0, nullptr, situ);
    const std::vector<double> silu = direct_moe(x, w13, w2, ids, w);
    double apart = 0;
    for (int64_t i = 0; i < T * H; ++i) {
      EXPECT_NEAR(out.ptr<float>()[i], want[i], 1e-5 * std::max(1.0, std::abs(want[i])));
      apart = std::max(apart, std::abs(want[i] - silu[i]));
    }
    EXPECT_GT(apart, 0.05) << "SiTU should differ from SiLU on these inputs";
    // The dense form on rows [g | u].
    Tensor gu = random_cpu({5, 2 * I}, DType::kF32, 35, -3, 3);
    Tensor a = Tensor::empty({5, I}, DType::kF32);
    kernels::glu(a, gu, ex.activation);
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t i = 0; i < I; ++i)
        EXPECT_NEAR(a.ptr<float>()[r * I + i],
                    situ(gu.ptr<float>()[r * 2 * I + i], gu.ptr<float>()[r * 2 * I + I + i]), 1e-6);
  }
  kernels::MoeExperts bad;
  bad.activation = kernels::Glu::situ(0.0f, 0.0f);
  Tensor gu = random_cpu({1, 4}, DType::kF32, 36), a = Tensor::empty({1, 2}, DType::kF32);
  EXPECT_ERROR_CONTAINS(kernels::glu(a, gu, bad.activation), "SiTU needs beta > 0");
}

TEST(AddGated, HandDerived) {
  Tensor a = f32({1, 2, 3, 4}, {2, 2}), b = f32({10, 20, 30, 40}, {2, 2}), g = f32({0, 2}, {2, 1});
  Tensor out = Tensor::empty({2, 2}, DType::kF32);
  kernels::add_gated(out, a, b, g);
  const double s = 1 / (1 + std::exp(-2.0));
  EXPECT_NEAR(out.ptr<float>()[0], 1 + 0.5 * 10, 1e-6);
  EXPECT_NEAR(out.ptr<float>()[1], 2 + 0.5 * 20, 1e-6);
  EXPECT_NEAR(out.ptr<float>()[2], 3 + s * 30, 1e-5);
  EXPECT_NEAR(out.ptr<float>()[3], 4 + s * 40, 1e-5);
}

// Qwen3-Next's gated shared expert: routed + sigmoid(x · g) * shared, checked against the same
// block built without the gate (routed + shared) and without shared experts (routed), all three
// with the same weights.
TEST(SparseMoeBlockShared, SigmoidGateScalesTheSharedExpertPerToken) {
  const int64_t H = 16, E = 4, I = 8, T = 5;
  // The layers keep their context by reference: one per registry, alive for the test.
  std::vector<std::unique_ptr<TestLayerContext>> ctxs;
  auto build = [&](ParamRegistry& reg, bool shared, bool gate) {
    ctxs.push_back(std::make_unique<TestLayerContext>(reg));
    LayerContext& ctx = ctxs.back()->ctx;
    SparseMoeOptions o;
    o.hidden = H;
    o.num_experts = E;
    o.moe_intermediate = I;
    o.router.top_k = 2;
    o.shared_intermediate = shared ? 2 * I : 0;
    o.shared_gate = gate;
    auto block = std::make_unique<SparseMoeBlock>(ctx, "mlp", o);
    for (const auto& [name, p] : reg.all()) {
      uint64_t h = 1469598103934665603ull;
      for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
      kernels::fill_uniform(p->data(), h, -0.5f, 0.5f);
    }
    return block;
  };
  ParamRegistry r_gate, r_plain, r_none;
  auto gated = build(r_gate, true, true);
  auto plain = build(r_plain, true, false);
  auto none = build(r_none, false, false);
  // The gate reads the first hidden channel: g = x[t, 0].
  Tensor& gw = r_gate.find("mlp.shared_expert_gate.weight")->data();
  gw.zero_();
  gw.ptr<float>()[0] = 1.0f;
  Batch batch;
  Arena arena(Device::cpu());
  Step step{batch, arena};
  const Tensor x = random_cpu({T, H}, DType::kF32, 9);
  const Tensor yg = gated->forward(step, x).clone(), yp = plain->forward(step, x).clone(),
               yn = none->forward(step, x).clone();
  for (int64_t t = 0; t < T; ++t) {
    const double s = 1 / (1 + std::exp(-static_cast<double>(x.ptr<float>()[t * H])));
    for (int64_t h = 0; h < H; ++h) {
      const double routed = yn.ptr<float>()[t * H + h];
      const double shared = yp.ptr<float>()[t * H + h] - routed;
      EXPECT_NEAR(yg.ptr<float>()[t * H + h], routed + s * shared, 1e-5) << t << "," << h;
    }
  }
  // A gate with fused shared experts cannot be: the fused slot's weight is 1.
  ParamRegistry r_bad;
  TestLayerContext bad(r_bad);
  LayerContext& ctx = bad.ctx;
  SparseMoeOptions o;
  o.hidden = H;
  o.num_experts = E;
  o.moe_intermediate = I;
  o.router.top_k = 2;
  o.shared_intermediate = I;
  o.fuse_shared = true;
  o.shared_gate = true;
  EXPECT_ERROR_CONTAINS(SparseMoeBlock(ctx, "mlp", o), "shared expert gate");
}

}  // namespace
}  // namespace atom::test
