// CUDA MoE kernels against the CPU reference: every router variant (exact ids, weights within
// 1e-6 relative, planted ties, NaN and infinite logits), fused_moe on both of its paths (decode
// and grouped GEMM) over ragged shapes, padded intermediates and fused shared slots, its
// determinism, GPT-OSS's experts (clamped SwiGLU, expert biases) on every path, and route +
// fused_moe captured in a CUDA graph and replayed on new inputs.
#include "kernels/moe.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/convert.h"
#include "core/cuda_check.h"
#include "common/test_util.h"
#include "core/arena.h"
#include "core/cuda_stream.h"
#include "dist/communicator.h"
#include "gpu_util.h"
#include "kernels/cuda/moe_dense.h"
#include "kernels/cuda_tuning.h"
#include "layers/moe.h"
#include "loader/hf_config.h"
#include "loader/safetensors.h"
#include "loader/weight_loading.h"
#include "models/model.h"

namespace atom::test {
namespace {

using kernels::GroupScore;
using kernels::RouterArgs;
using kernels::RouterScoring;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Logits on a grid of `levels` values lo + step * i: many exact ties (equal inputs give equal
// scores on both devices) and no near-ties that the devices' last-bit differences in expf could
// order differently.
Tensor grid_logits(int64_t T, int64_t E, int64_t stride, uint64_t seed, int levels, float step,
                   float lo) {
  std::mt19937_64 rng(seed);
  Tensor t = Tensor::empty({T, stride}, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.ptr<float>()[i] = lo + step * static_cast<float>(rng() % static_cast<uint64_t>(levels));
  (void)E;
  return t;
}

// Rows with planted special values: all NaN, NaN in the first column, NaN elsewhere, all equal,
// infinities, all -inf, two equal maxima.
void plant_special_rows(Tensor& l, int64_t E) {
  const int64_t T = l.size(0), ld = l.size(1);
  float* p = l.ptr<float>();
  auto row = [&](int64_t r) { return p + (r % T) * ld; };
  for (int64_t e = 0; e < E; ++e) row(0)[e] = kNaN;
  row(1)[0] = kNaN;
  row(2)[E / 2] = kNaN;
  row(2)[E - 1] = kNaN;
  for (int64_t e = 0; e < E; ++e) row(3)[e] = 0.25f;
  row(4)[1] = kInf;
  row(4)[E - 2] = -kInf;
  for (int64_t e = 0; e < E; ++e) row(5)[e] = -kInf;
  row(6)[3 % E] = 7.0f;
  row(6)[(E - 1) % E] = 7.0f;
  for (int64_t e = 0; e < E; e += 2) row(7)[e] = -kInf;
}

struct RouteCase {
  const char* name;
  int64_t T, E;
  RouterArgs a;
  int bias = 0;  // 0: none, 1: on a grid, 2: continuous
  bool strided = false;
  int levels = 128;
  float step = 1.0f / 16, lo = -4.0f;
};

void check_route(const RouteCase& c, uint64_t seed) {
  SCOPED_TRACE(c.name);
  const int64_t KT = c.a.top_k + c.a.num_fused_shared;
  const int64_t ld = c.strided ? c.E + 5 : c.E;
  Tensor lw = grid_logits(c.T, c.E, ld, seed, c.levels, c.step, c.lo);
  plant_special_rows(lw, c.E);
  Tensor l = lw.narrow(1, 0, c.E);
  Tensor bias;
  if (c.bias == 1) {
    std::mt19937_64 rng(seed + 1);
    bias = Tensor::empty({c.E}, DType::kF32);
    for (int64_t e = 0; e < c.E; ++e)
      bias.ptr<float>()[e] = -0.25f + 0.0625f * static_cast<float>(rng() % 8);
  } else if (c.bias == 2) {
    bias = random_cpu({c.E}, DType::kF32, seed + 1, -0.3f, 0.3f);
  }
  Tensor ref_ids = Tensor::empty({c.T, KT}, DType::kI32);
  Tensor ref_w = Tensor::empty({c.T, KT}, DType::kF32);
  kernels::moe_route(ref_ids, ref_w, l, bias, c.a);
  Tensor gl = lw.to(gpu()).narrow(1, 0, c.E);
  Tensor gb = bias.defined() ? bias.to(gpu()) : Tensor();
  Tensor ids = Tensor::empty({c.T, KT}, DType::kI32, gpu());
  Tensor w = Tensor::empty({c.T, KT}, DType::kF32, gpu());
  poison(ids);
  poison(w);
  kernels::moe_route(ids, w, gl, gb, c.a);
  Tensor hi = host(ids), hw = host(w);
  ASSERT_EQ(hi.shape(), ref_ids.shape());
  ASSERT_EQ(hw.shape(), ref_w.shape());
  const int64_t S = std::max<int64_t>(c.E, c.a.shared_slot_first + c.a.num_fused_shared);
  int bad_ids = 0, bad_w = 0, shown = 0;
  const float* lh = l.ptr<float>();
  for (int64_t i = 0; i < c.T * KT; ++i) {
    const int32_t g = hi.ptr<int32_t>()[i], r = ref_ids.ptr<int32_t>()[i];
    // -1: an expert another rank holds (RouterArgs::local_count).
    ASSERT_TRUE((g >= 0 && g < S) || (g == -1 && c.a.local_count != -1))
        << "row " << i / KT << " id " << g;
    const float a = hw.ptr<float>()[i], b = ref_w.ptr<float>()[i];
    const bool w_ok = std::isnan(b)
                          ? std::isnan(a)
                          : !std::isnan(a) && std::fabs(a - b) <= 1e-6 * std::fabs(b) + 1e-30;
    bad_ids += g != r;
    bad_w += !w_ok;
    if ((g != r || !w_ok) && shown++ < 6) {
      const int64_t t = i / KT;
      ADD_FAILURE() << "row " << t << " choice " << i % KT << ": gpu id " << g << " w " << a
                    << ", cpu id " << r << " w " << b << " (logits "
                    << lh[t * ld + (std::max(g, 0) % c.E)] << " / "
                    << lh[t * ld + (std::max(r, 0) % c.E)] << ")";
    }
  }
  EXPECT_EQ(bad_ids, 0);
  EXPECT_EQ(bad_w, 0);
}

RouterArgs softmax(int k, bool renorm, int shared = 0, int shared_first = 0) {
  RouterArgs a;
  a.scoring = RouterScoring::kSoftmax;
  a.top_k = k;
  a.renormalize = renorm;
  a.num_fused_shared = shared;
  a.shared_slot_first = shared_first;
  return a;
}

RouterArgs sigmoid(int k, bool renorm, int groups, int keep, GroupScore gs, float scale,
                   int shared = 0, int shared_first = 0) {
  RouterArgs a;
  a.scoring = RouterScoring::kSigmoid;
  a.top_k = k;
  a.renormalize = renorm;
  a.n_group = groups;
  a.topk_group = keep;
  a.group_score = gs;
  a.routed_scaling_factor = scale;
  a.num_fused_shared = shared;
  a.shared_slot_first = shared_first;
  return a;
}

RouterArgs topk_softmax(int k) {
  RouterArgs a;
  a.scoring = RouterScoring::kTopKThenSoftmax;
  a.top_k = k;
  return a;
}

// DeepSeek-V4: sqrt(softplus) scores, renormalised (+ 1e-20) and scaled.
RouterArgs sqrt_softplus(int k, float scale) {
  RouterArgs a;
  a.scoring = RouterScoring::kSqrtSoftplus;
  a.top_k = k;
  a.renormalize = true;
  a.routed_scaling_factor = scale;
  return a;
}

// Expert parallelism: this rank holds experts [first, first + count).
RouterArgs on_rank(RouterArgs a, int first, int count) {
  a.local_first = first;
  a.local_count = count;
  return a;
}

TEST(GpuMoe, RouterMatchesCpu) {
  // Sigmoid with group sums: 16 positive logit levels 0.25 apart and no bias (sums of two
  // distinct sigmoid values then differ by at least 1.2e-4; sigmoid(x) + sigmoid(-x) = 1 would
  // tie distinct pairs up to rounding), or a per-expert bias on a grid of 1/16 with max group
  // scores (sigmoid + bias values then differ by at least 8e-5 unless equal).
  const RouteCase cases[] = {
      {"softmax E128 top8 renorm (Qwen3-MoE)", 300, 128, softmax(8, true), 0, true},
      {"softmax E8 top2 renorm (Mixtral)", 7, 8, softmax(2, true)},
      {"softmax E64 top6", 65, 64, softmax(6, false)},
      {"softmax E60 top4, 1 token", 1, 60, softmax(4, false)},
      {"softmax E512 top10 renorm + shared (Qwen3-Next)", 130, 512, softmax(10, true, 1, 512), 0,
       true},
      {"softmax E512 top16", 40, 512, softmax(16, false, 0, 0), 0, false, 512, 1.0f / 64, -4.0f},
      {"softmax E8 top8", 9, 8, softmax(8, true)},
      {"sigmoid E256 top8 G8/4 top2-sum renorm x2.5", 300, 256,
       sigmoid(8, true, 8, 4, GroupScore::kTop2Sum, 2.5f), 0, true, 16, 0.25f, 0.0f},
      {"sigmoid E256 top8 G8/4 max bias renorm x2.5 + shared", 200, 256,
       sigmoid(8, true, 8, 4, GroupScore::kMax, 2.5f, 1, 256), 1, false, 32, 1.0f / 8, -2.0f},
      {"sigmoid E160 top8 bias renorm x2.5 + shared (GLM-4.5)", 64, 160,
       sigmoid(8, true, 1, 1, GroupScore::kTop2Sum, 2.5f, 1, 160), 1, false, 32, 1.0f / 8, -2.0f},
      {"sigmoid E384 top8 bias renorm x2.827 (Kimi K2)", 33, 384,
       sigmoid(8, true, 1, 1, GroupScore::kTop2Sum, 2.827f), 1, true, 32, 1.0f / 8, -2.0f},
      {"sigmoid E128 top8 G8/2 max", 50, 128, sigmoid(8, false, 8, 2, GroupScore::kMax, 1.0f), 0,
       false, 64, 1.0f / 16, -2.0f},
      {"sigmoid E64 top6 G32/3 top2-sum (groups of 2)", 50, 64,
       sigmoid(6, false, 32, 3, GroupScore::kTop2Sum, 1.0f), 0, false, 16, 0.25f, 0.0f},
      {"topk-softmax E32 top4 (GPT-OSS)", 300, 32, topk_softmax(4)},
      {"topk-softmax E128 top4", 33, 128, topk_softmax(4), 0, true},
      {"topk-softmax E8 top1", 9, 8, topk_softmax(1)},
      // Expert parallelism: other ranks' experts written as -1, this rank's as local slots.
      {"softmax E128 top8 renorm, rank holding 43..85", 300, 128, on_rank(softmax(8, true), 43, 43),
       0, true},
      {"sigmoid E256 top8 G8/4 max bias + shared, rank holding 192..255", 200, 256,
       on_rank(sigmoid(8, true, 8, 4, GroupScore::kMax, 2.5f, 1, 64), 192, 64), 1, false, 32,
       1.0f / 8, -2.0f},
      {"topk-softmax E32 top4, rank holding 0..10", 300, 32, on_rank(topk_softmax(4), 0, 11)},
      {"sigmoid E896 top16 bias renorm x1.5 + shared (Kimi-K3)", 70, 896,
       sigmoid(16, true, 1, 1, GroupScore::kTop2Sum, 1.5f, 1, 896), 2, true, 512, 1.0f / 64, -4.0f},
      {"softmax E1024 top16, 1 token", 1, 1024, softmax(16, false), 0, false, 1024, 1.0f / 128,
       -4.0f},
      {"sigmoid E1024 top8 G8/4 max", 9, 1024, sigmoid(8, false, 8, 4, GroupScore::kMax, 1.0f), 0,
       false, 1024, 1.0f / 128, -4.0f},
      {"sqrt-softplus E256 top6 renorm x1.5 (DeepSeek-V4)", 200, 256, sqrt_softplus(6, 1.5f)},
      {"sqrt-softplus E64 top8, rank holding 32..63", 65, 64,
       on_rank(sqrt_softplus(8, 1.0f), 32, 32)},
  };
  uint64_t seed = 100;
  for (const RouteCase& c : cases) check_route(c, seed += 7);
}

// EPLB's replicas and load statistic on the GPU: ids (physical replica by token row, then this
// rank's slot or -1) and the per-expert counts exactly as the CPU's, over grid logits.
TEST(GpuMoe, RouterReplicasAndLoadMatchCpu) {
  const int64_t T = 300, E = 64;
  const int K = 6, R = 16, ranks = 4, L = static_cast<int>((E + R) / ranks);
  // Physical p copies logical p % E (vLLM's initial placement); this rank is rank 3.
  Tensor table = Tensor::zeros({E, R + 1}, DType::kI32), count = Tensor::zeros({E}, DType::kI32);
  for (int64_t p = 0; p < E + R; ++p) {
    const int64_t e = p % E;
    table.ptr<int32_t>()[e * (R + 1) + count.ptr<int32_t>()[e]++] = static_cast<int32_t>(p);
  }
  Tensor l = grid_logits(T, E, E, 321, 128, 1.0f / 16, -4.0f);
  RouterArgs a = on_rank(softmax(K, true), 3 * L, L);
  Tensor ref_ids = Tensor::empty({T, K}, DType::kI32), ref_w = Tensor::empty({T, K}, DType::kF32);
  Tensor ref_load = Tensor::zeros({E}, DType::kI64);
  a.replicas = &table;
  a.replica_count = &count;
  a.expert_load = &ref_load;
  kernels::moe_route(ref_ids, ref_w, l, Tensor(), a);
  Tensor gt = table.to(gpu()), gc = count.to(gpu()), gload = Tensor::zeros({E}, DType::kI64, gpu());
  Tensor ids = Tensor::empty({T, K}, DType::kI32, gpu()),
         w = Tensor::empty({T, K}, DType::kF32, gpu());
  poison(ids);
  RouterArgs g = a;
  g.replicas = &gt;
  g.replica_count = &gc;
  g.expert_load = &gload;
  kernels::moe_route(ids, w, l.to(gpu()), Tensor(), g);
  EXPECT_TRUE(same_bytes(ids, ref_ids));
  EXPECT_TRUE(same_bytes(gload, ref_load));
  int64_t total = 0, mine = 0;
  for (int64_t e = 0; e < E; ++e) total += ref_load.ptr<int64_t>()[e];
  for (int64_t i = 0; i < T * K; ++i) mine += ref_ids.ptr<int32_t>()[i] >= 0;
  EXPECT_EQ(total, T * K);
  EXPECT_GT(mine, 0);
  EXPECT_LT(mine, T * K);
}

// DeepSeek-V4's router on continuous logits and correction bias, as DeepSeek-V3's below.
TEST(GpuMoe, RouterContinuousDeepSeekV4) {
  RouteCase c{"sqrt-softplus E256 top6 continuous bias x1.5", 64, 256, sqrt_softplus(6, 1.5f), 2};
  c.levels = 1 << 30;
  c.step = 6.0f / static_cast<float>(1 << 30);
  c.lo = -3.0f;
  check_route(c, 4343);
}

// DeepSeek-V4's hash layers: the given experts (tid2eid of each token), weighted by their
// sqrt-softplus scores, as the CPU's; under expert parallelism mapped to this rank's slots or -1.
// An id outside the experts is written as -1 (the CPU refuses it by name before routing).
TEST(GpuMoe, RouterFixedIdsMatchCpu) {
  const int64_t T = 37, E = 16;
  const int K = 4;
  Tensor l = random_cpu({T, E}, DType::kF32, 77, -3, 3);
  Tensor fixed = Tensor::empty({T, K}, DType::kI32);
  std::mt19937_64 rng(78);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> perm(E);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::copy_n(perm.begin(), K, fixed.ptr<int32_t>() + t * K);
  }
  for (const RouterArgs& base : {sqrt_softplus(K, 1.5f), on_rank(sqrt_softplus(K, 1.5f), 4, 8)}) {
    RouterArgs a = base;
    a.fixed_ids = &fixed;
    Tensor ref_ids = Tensor::empty({T, K}, DType::kI32), ref_w = Tensor::empty({T, K}, DType::kF32);
    kernels::moe_route(ref_ids, ref_w, l, Tensor(), a);
    Tensor gf = fixed.to(gpu());
    RouterArgs g = a;
    g.fixed_ids = &gf;
    Tensor ids = Tensor::empty({T, K}, DType::kI32, gpu()),
           w = Tensor::empty({T, K}, DType::kF32, gpu());
    poison(ids);
    kernels::moe_route(ids, w, l.to(gpu()), Tensor(), g);
    EXPECT_TRUE(same_bytes(ids, ref_ids));
    EXPECT_LE(max_abs_diff(host(w), ref_w), 1e-6f);
  }
  fixed.ptr<int32_t>()[5] = E;  // row 1, choice 1: not an expert
  RouterArgs g = sqrt_softplus(K, 1.5f);
  Tensor gf = fixed.to(gpu());
  g.fixed_ids = &gf;
  Tensor ids = Tensor::empty({T, K}, DType::kI32, gpu()),
         w = Tensor::empty({T, K}, DType::kF32, gpu());
  kernels::moe_route(ids, w, l.to(gpu()), Tensor(), g);
  const Tensor hi = host(ids);
  EXPECT_EQ(hi.ptr<int32_t>()[5], -1);
  EXPECT_EQ(hi.ptr<int32_t>()[4], fixed.ptr<int32_t>()[4]);
}

// DeepSeek-V3's router on continuous logits and bias (no planted grid): exact agreement is
// expected unless two choice values lie within the devices' last-bit differences.
TEST(GpuMoe, RouterContinuousDeepSeekV3) {
  RouteCase c{"sigmoid E256 top8 G8/4 top2-sum, continuous bias", 64, 256,
              sigmoid(8, true, 8, 4, GroupScore::kTop2Sum, 2.5f), 2};
  c.levels = 1 << 30;
  c.step = 6.0f / static_cast<float>(1 << 30);
  c.lo = -3.0f;
  check_route(c, 4242);
}

TEST(GpuMoe, RouterRejectsWhatItCannotRoute) {
  Tensor l = Tensor::empty({2, 1100}, DType::kF32, gpu());  // over kMoeRouteMaxExperts
  Tensor ids = Tensor::empty({2, 4}, DType::kI32, gpu()),
         w = Tensor::empty({2, 4}, DType::kF32, gpu());
  EXPECT_THROW(kernels::moe_route(ids, w, l, Tensor(), softmax(4, true)), Error);
  Tensor l2 = Tensor::empty({2, 64}, DType::kF32, gpu());
  Tensor ids2 = Tensor::empty({2, 3}, DType::kI32, gpu());
  EXPECT_THROW(kernels::moe_route(ids2, w, l2, Tensor(), softmax(4, true)), Error);
}

// ---------------------------------------------------------------- fused_moe

struct MoeCase {
  int64_t T, E, K;
  int shared;
  int64_t H, I, I_pad;
  DType dt = DType::kBF16, out = DType::kBF16;
  bool skewed = false;   // every token to experts 0 .. K-1
  bool strided = false;  // x rows with a gap
  // GPT-OSS's experts: the clamped SwiGLU (limit <= 0: SiLU·mul) and which biases are present
  // (1: w13's, 2: w2's, 3: both).
  float limit = 0.0f, alpha = 1.702f;
  int biases = 0;
  // With a limit: DeepSeek-V4's / GLM-5.3's silu(min(g, limit)) * clamp(u, ±limit) instead.
  bool silu_clamped = false;
  // > 0: Kimi-K3's SiTU with this beta and situ_linear_beta (0: up unchanged) instead.
  float situ_beta = 0.0f, situ_linear_beta = 0.0f;
};

std::string case_name(const MoeCase& c) {
  std::string act;
  if (c.limit > 0 && c.silu_clamped) act += fmt::format(" silu-clamped l={}", c.limit);
  if (c.limit > 0 && !c.silu_clamped) act += fmt::format(" swiglu-oai a={} l={}", c.alpha, c.limit);
  if (c.situ_beta > 0) act += fmt::format(" situ b={} lb={}", c.situ_beta, c.situ_linear_beta);
  if (c.biases) act += c.biases == 3 ? " b13+b2" : c.biases == 1 ? " b13" : " b2";
  return fmt::format("T={} E={} K={}+{} H={} I={}/{} {}->{}{}{}{}", c.T, c.E, c.K, c.shared, c.H,
                     c.I, c.I_pad, dtype_name(c.dt), dtype_name(c.out), c.skewed ? " skewed" : "",
                     c.strided ? " strided" : "", act);
}

struct MoeInputs {
  Tensor xw, x, w13, w2, ids, wts;  // host
  Tensor b13, b2;                   // host, or undefined
};

// The experts of a case (activation, biases) over the given weights.
kernels::MoeExperts experts_of(const MoeCase& c, const Tensor& w13, const Tensor& w2,
                               const Tensor& b13, const Tensor& b2) {
  kernels::MoeExperts ex;
  ex.w13 = &w13;
  ex.w2 = &w2;
  ex.w13_bias = b13.defined() ? &b13 : nullptr;
  ex.w2_bias = b2.defined() ? &b2 : nullptr;
  if (c.limit > 0) {
    ex.activation.kind = c.silu_clamped ? kernels::MoeActivation::kSiluMulClamped
                                        : kernels::MoeActivation::kSwigluOai;
    ex.activation.alpha = c.alpha;
    ex.activation.limit = c.limit;
  }
  if (c.situ_beta > 0) ex.activation = kernels::Glu::situ(c.situ_beta, c.situ_linear_beta);
  return ex;
}

MoeInputs make_inputs(const MoeCase& c, uint64_t seed) {
  MoeInputs in;
  const int64_t S = c.E + c.shared, KT = c.K + c.shared;
  const int64_t ld = c.strided ? c.H + 24 : c.H;
  in.xw = random_cpu({c.T, ld}, c.dt, seed, -1, 1);
  in.x = in.xw.narrow(1, c.strided ? 16 : 0, c.H);
  in.w13 = random_cpu({S, 2 * c.I_pad, c.H}, c.dt, seed + 1, -0.1f, 0.1f);
  in.w2 = random_cpu({S, c.H, c.I_pad}, c.dt, seed + 2, -0.1f, 0.1f);
  // Padding rows of w13 (gate and up) and columns of w2 are zero.
  const int64_t eb = static_cast<int64_t>(dtype_bytes(c.dt, 1));
  for (int64_t s = 0; s < S; ++s) {
    char* w13 = static_cast<char*>(in.w13.data()) + s * 2 * c.I_pad * c.H * eb;
    for (int64_t i = c.I; i < c.I_pad; ++i) {
      std::memset(w13 + i * c.H * eb, 0, c.H * eb);
      std::memset(w13 + (c.I_pad + i) * c.H * eb, 0, c.H * eb);
    }
    char* w2 = static_cast<char*>(in.w2.data()) + s * c.H * c.I_pad * eb;
    for (int64_t h = 0; h < c.H; ++h)
      std::memset(w2 + (h * c.I_pad + c.I) * eb, 0, (c.I_pad - c.I) * eb);
  }
  // Biases about as large as the products (GPT-OSS's are), so that they move the clamps; the
  // padding entries of w13's are zero.
  if (c.biases & 1) {
    in.b13 = random_cpu({S, 2 * c.I_pad}, c.dt, seed + 4, -0.5f, 0.5f);
    char* b = static_cast<char*>(in.b13.data());
    for (int64_t s = 0; s < S; ++s)
      for (int half = 0; half < 2; ++half)
        std::memset(b + (s * 2 * c.I_pad + half * c.I_pad + c.I) * eb, 0, (c.I_pad - c.I) * eb);
  }
  if (c.biases & 2) in.b2 = random_cpu({S, c.H}, c.dt, seed + 5, -0.5f, 0.5f);
  std::mt19937_64 rng(seed + 3);
  in.ids = Tensor::empty({c.T, KT}, DType::kI32);
  in.wts = Tensor::empty({c.T, KT}, DType::kF32);
  std::vector<int32_t> perm(static_cast<size_t>(c.E));
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t e = 0; e < c.E; ++e) perm[e] = static_cast<int32_t>(e);
    if (!c.skewed)
      for (int64_t j = 0; j < c.K; ++j)
        std::swap(perm[j], perm[j + static_cast<int64_t>(rng() % (c.E - j))]);
    for (int64_t j = 0; j < KT; ++j) {
      in.ids.ptr<int32_t>()[t * KT + j] = j < c.K ? perm[j] : static_cast<int32_t>(c.E + (j - c.K));
      // Every fifth token gives its first expert weight 0: it still counts (0 * its output).
      const float wt = j < c.K ? static_cast<float>(rng() % 1000) / 1000.0f : 1.0f;
      in.wts.ptr<float>()[t * KT + j] = (t % 5 == 0 && j == 0) ? 0.0f : wt;
    }
  }
  return in;
}

// One way fused_moe can run: (name, decode max rows, GEMM tile rows, decode depth, dense min
// rows).
struct FusedPath {
  const char* name;
  int decode_rows, tile_rows, depth, dense_rows = 0;
};

// The tuned default, then each path that applies to R routed rows: both GEMM tiles, the decode
// kernel at both depths (R <= 512), and the per-slot dense path (cuBLASLt per slot: SiLU·mul
// without biases, `dense` true, from kMoeDenseMinRoutedRows rows; forced here at any rows per
// slot).
std::vector<FusedPath> fused_paths(int64_t R, bool dense) {
  const kernels::cuda::CudaTuning& base = kernels::cuda::cuda_tuning();
  std::vector<FusedPath> paths = {{"auto", base.moe_decode_max_rows, base.moe_gemm_tile_rows,
                                   base.moe_decode_depth, base.moe_dense_min_rows},
                                  {"gemm64", 0, 64, 2},
                                  {"gemm128", 0, 128, 2}};
  if (R <= 512) {
    paths.push_back({"decode", 512, 0, 2});
    paths.push_back({"decode4", 512, 0, 4});
  }
  if (R >= kernels::cuda::kMoeDenseMinRoutedRows && dense) {
    paths.push_back({"dense64", 0, 64, 2, 1});
    paths.push_back({"dense128", 0, 128, 2, 1});
  }
  return paths;
}

// The tuning that runs path p (the dense path forced at any slot count).
kernels::cuda::CudaTuning path_tuning(const FusedPath& p) {
  return kernels::cuda::cuda_tuning_with([&](kernels::cuda::CudaTuning& t) {
    t.moe_decode_max_rows = p.decode_rows;
    t.moe_gemm_tile_rows = p.tile_rows;
    t.moe_decode_depth = p.depth;
    t.moe_dense_min_rows = p.dense_rows;
    t.moe_dense_max_slots = kernels::cuda::kMoeMaxSlots;
  });
}

// fused_moe on the GPU (outputs and workspace poisoned first).
Tensor run_gpu(const MoeCase& c, const Tensor& gx, const Tensor& g13, const Tensor& g2,
               const Tensor& gb13, const Tensor& gb2, const Tensor& gids, const Tensor& gw) {
  const kernels::MoeExperts ex = experts_of(c, g13, g2, gb13, gb2);
  const int64_t KT = c.K + c.shared;
  const int64_t bytes = kernels::fused_moe_workspace_bytes(gpu(), c.T, KT, ex, c.dt);
  Tensor ws = Tensor::empty({std::max<int64_t>(bytes, 1)}, DType::kU8, gpu());
  poison(ws);
  Tensor out = Tensor::empty({c.T, c.H}, c.out, gpu());
  poison(out);
  kernels::fused_moe(out, gx, ex, gids, gw, &ws);
  return out;
}

void check_fused(const MoeCase& c, uint64_t seed) {
  SCOPED_TRACE(case_name(c));
  MoeInputs in = make_inputs(c, seed);
  const kernels::MoeExperts ex = experts_of(c, in.w13, in.w2, in.b13, in.b2);
  Tensor ref = Tensor::empty({c.T, c.H}, DType::kF32);
  kernels::fused_moe(ref, in.x, ex, in.ids, in.wts, nullptr);
  Tensor gx = in.xw.to(gpu()).narrow(1, c.strided ? 16 : 0, c.H);
  Tensor g13 = in.w13.to(gpu()), g2 = in.w2.to(gpu());
  Tensor gb13 = in.b13.defined() ? in.b13.to(gpu()) : Tensor();
  Tensor gb2 = in.b2.defined() ? in.b2.to(gpu()) : Tensor();
  Tensor gids = in.ids.to(gpu()), gw = in.wts.to(gpu());
  // bf16 outputs: one more rounding than the fp32 reference; the activations are rounded to
  // the weights' type between the two GEMMs (the CPU keeps fp32).
  const double tol = c.dt == DType::kF16 ? 3e-3 : 5e-3;
  for (const FusedPath& p : fused_paths(c.T * (c.K + c.shared), c.limit <= 0 && c.biases == 0)) {
    SCOPED_TRACE(p.name);
    const kernels::cuda::CudaTuningScope scope(path_tuning(p));
    Tensor out = run_gpu(c, gx, g13, g2, gb13, gb2, gids, gw);
    Tensor ho = host(out);
    ASSERT_EQ(ho.shape(), ref.shape());
    const double err = rel_err(ho, ref);
    EXPECT_LE(err, tol);
    std::printf("  %-58s %-8s err %.2e\n", case_name(c).c_str(), p.name, err);
    // Deterministic: a second run gives the same bytes.
    Tensor again = run_gpu(c, gx, g13, g2, gb13, gb2, gids, gw);
    EXPECT_TRUE(same_bytes(out, again));
  }
}

TEST(GpuMoe, FusedMatchesCpu) {
  const MoeCase cases[] = {
      {1, 8, 2, 0, 256, 128, 128},
      {2, 64, 8, 1, 264, 136, 144},
      {3, 128, 8, 0, 200, 72, 80, DType::kBF16, DType::kF32},
      {8, 8, 1, 0, 520, 200, 200},
      {8, 128, 8, 1, 1032, 264, 264},
      {32, 128, 8, 1, 256, 192, 200},
      {32, 8, 2, 0, 136, 64, 64, DType::kBF16, DType::kF32, false, true},
      {100, 64, 2, 0, 264, 136, 136},
      {100, 8, 8, 0, 128, 64, 72},
      {600, 128, 8, 0, 256, 192, 192, DType::kBF16, DType::kBF16, false, true},
      {600, 8, 2, 0, 264, 136, 136, DType::kBF16, DType::kF32, true},
      {2048, 64, 8, 1, 264, 200, 208},
      {2048, 128, 1, 0, 128, 64, 64, DType::kBF16, DType::kF32},
      {37, 8, 2, 0, 128, 64, 64, DType::kF16, DType::kF16},
      {48, 8, 2, 1, 136, 64, 64, DType::kBF16, DType::kBF16, true},  // decode: 2 passes of 32
      {300, 64, 8, 1, 136, 72, 80, DType::kF16, DType::kBF16},
  };
  uint64_t seed = 1000;
  for (const MoeCase& c : cases) check_fused(c, seed += 11);
}

// Expert parallelism: each of three ranks routes every token with its expert range (others' ids
// -1), runs fused_moe over its own experts only, and the ranks' outputs add up to the whole
// layer's on the CPU, on every path (decode, both GEMM tiles, the per-slot dense path).
TEST(GpuMoe, ExpertParallelRanksSumToTheWholeLayer) {
  struct EpCase {
    int64_t T, E;
    int K;
    int64_t H, I;
  };
  const EpCase cases[] = {
      {1, 8, 2, 256, 128}, {5, 64, 8, 264, 136}, {300, 64, 6, 136, 72}, {2048, 16, 4, 128, 64}};
  const int ranks = 3;
  uint64_t seed = 4000;
  for (const EpCase& e : cases) {
    const MoeCase c{e.T, e.E, e.K, 0, e.H, e.I, e.I, DType::kBF16, DType::kF32};
    SCOPED_TRACE(case_name(c));
    seed += 13;
    const MoeInputs in = make_inputs(c, seed);
    // Router logits on a grid (exact ties resolved alike on both devices).
    Tensor logits = grid_logits(e.T, e.E, e.E, seed + 7, 128, 1.0f / 16, -4.0f);
    const RouterArgs whole = softmax(e.K, true);
    Tensor ids = Tensor::empty({e.T, e.K}, DType::kI32),
           wts = Tensor::empty({e.T, e.K}, DType::kF32);
    kernels::moe_route(ids, wts, logits, Tensor(), whole);
    Tensor ref = Tensor::empty({e.T, e.H}, DType::kF32);
    kernels::fused_moe(ref, in.x, experts_of(c, in.w13, in.w2, Tensor(), Tensor()), ids, wts,
                       nullptr);
    Tensor gl = logits.to(gpu()), gx = in.x.to(gpu());
    for (const FusedPath& p : fused_paths(e.T * e.K, true)) {
      SCOPED_TRACE(p.name);
      const kernels::cuda::CudaTuningScope scope(path_tuning(p));
      std::vector<float> sum(static_cast<size_t>(e.T * e.H), 0.0f);
      int64_t local_rows = 0;
      for (int r = 0; r < ranks; ++r) {
        const ExpertShare share = ExpertShare::of(e.E, r, ranks);
        const int64_t count = share.count, first = share.first;
        Tensor gids = Tensor::empty({e.T, e.K}, DType::kI32, gpu());
        Tensor gw = Tensor::empty({e.T, e.K}, DType::kF32, gpu());
        poison(gids);
        kernels::moe_route(gids, gw, gl, Tensor(),
                           on_rank(whole, static_cast<int>(first), static_cast<int>(count)));
        const Tensor hids = host(gids);
        for (int64_t i = 0; i < e.T * e.K; ++i) {
          const int32_t g = hids.ptr<int32_t>()[i], want = ids.ptr<int32_t>()[i];
          const bool mine = want >= first && want < first + count;
          ASSERT_EQ(g, mine ? want - first : -1) << "rank " << r << " choice " << i;
          local_rows += mine;
        }
        Tensor g13 = in.w13.narrow(0, first, count).contiguous().to(gpu());
        Tensor g2 = in.w2.narrow(0, first, count).contiguous().to(gpu());
        MoeCase rc = c;
        rc.E = count;
        Tensor out = run_gpu(rc, gx, g13, g2, Tensor(), Tensor(), gids, gw);
        const Tensor ho = host(out);  // F32
        for (int64_t i = 0; i < e.T * e.H; ++i) sum[i] += ho.ptr<float>()[i];
      }
      EXPECT_EQ(local_rows, e.T * e.K) << "every choice on exactly one rank";
      Tensor got = Tensor::empty({e.T, e.H}, DType::kF32);
      std::memcpy(got.data(), sum.data(), sum.size() * sizeof(float));
      const double err = rel_err(got, ref);
      EXPECT_LE(err, 5e-3);
      std::printf("  ep%d %-50s %-8s err %.2e\n", ranks, case_name(c).c_str(), p.name, err);
    }
  }
}

// DeepSeek-V4's and GLM-5.3's experts: silu(min(g, limit)) * clamp(u, ±limit) with limits the
// products (about 0.3-0.6 wide here) cross often (and 10, unclamped), on the decode path and the
// GEMMs with both tile sizes, fused shared slots, padded intermediates, BF16 and F16.
TEST(GpuMoe, FusedClampedSiluMatchesCpu) {
  auto clamped = [](MoeCase c, float limit) {
    c.limit = limit;
    c.silu_clamped = true;
    return c;
  };
  const MoeCase cases[] = {
      clamped({1, 32, 6, 1, 256, 128, 128}, 0.4f),  // V4-like top-6 + a shared slot
      clamped({4, 8, 2, 0, 264, 136, 144}, 0.5f),   // padded I
      clamped({8, 64, 8, 1, 200, 72, 80, DType::kBF16, DType::kF32}, 0.4f),
      clamped({100, 32, 6, 0, 264, 136, 144}, 10.0f),  // unclamped
      clamped({600, 32, 6, 1, 256, 192, 200, DType::kBF16, DType::kBF16, false, true}, 0.4f),
      clamped({2048, 32, 4, 0, 264, 200, 208}, 0.3f),  // 8k rows: 128-row tiles
      clamped({300, 64, 8, 0, 136, 72, 80, DType::kF16, DType::kF16}, 0.4f),
  };
  for (const MoeCase& c : cases) check_fused(c, 900 + c.T);
}

// Kimi-K3's experts: SiTU with betas the gate and up products (about 0.3-0.6 wide here) cross
// (and a linear beta of 0, up unchanged), on the decode path and the GEMMs with both tile sizes,
// fused shared slots, padded intermediates, BF16 and F16.
TEST(GpuMoe, FusedSituMatchesCpu) {
  auto situ = [](MoeCase c, float beta, float lb) {
    c.situ_beta = beta;
    c.situ_linear_beta = lb;
    return c;
  };
  const MoeCase cases[] = {
      situ({1, 32, 8, 1, 256, 128, 128}, 0.3f, 0.4f),  // top-8 + a shared slot
      situ({4, 8, 2, 0, 264, 136, 144}, 0.3f, 0.0f),   // padded I, no linear cap
      situ({8, 64, 8, 1, 200, 72, 80, DType::kBF16, DType::kF32}, 0.25f, 0.3f),
      situ({600, 32, 6, 1, 256, 192, 200, DType::kBF16, DType::kBF16, false, true}, 0.3f, 0.4f),
      situ({2048, 32, 4, 0, 264, 200, 208}, 0.3f, 0.4f),  // 8k rows: 128-row tiles
      situ({300, 64, 8, 0, 136, 72, 80, DType::kF16, DType::kF16}, 0.3f, 0.4f),
  };
  for (const MoeCase& c : cases) check_fused(c, 1700 + c.T);
}

// GPT-OSS's experts: the clamped SwiGLU with a limit the products cross often (0.4-0.8: the
// gate and up products here are about 0.3-0.6 wide; 7 leaves it unclamped), biases present and
// absent, on the decode path and the GEMMs with both tile sizes (check_fused runs every path
// that applies), padded intermediates, F16 and F32 outputs.
TEST(GpuMoe, FusedSwigluOaiMatchesCpu) {
  auto oai = [](MoeCase c, float limit, int biases, float alpha = 1.702f) {
    c.limit = limit;
    c.biases = biases;
    c.alpha = alpha;
    return c;
  };
  const MoeCase cases[] = {
      oai({1, 32, 4, 0, 256, 128, 128}, 0.5f, 3),  // gpt-oss: E 32 top-4
      oai({1, 8, 2, 0, 264, 136, 144}, 0.6f, 0),   // no biases, padded I
      oai({2, 32, 4, 0, 200, 72, 80, DType::kBF16, DType::kF32}, 0.4f, 3),
      oai({8, 32, 4, 0, 520, 200, 208}, 7.0f, 3),         // unclamped
      oai({8, 128, 4, 0, 1032, 264, 264}, 0.5f, 1),       // b13 only
      oai({32, 32, 4, 0, 256, 192, 200}, 0.5f, 2, 1.0f),  // b2 only
      oai({48, 8, 2, 0, 136, 64, 64, DType::kBF16, DType::kBF16, true}, 0.8f, 3),
      oai({100, 32, 4, 0, 264, 136, 144}, 0.5f, 3),
      oai({600, 32, 4, 0, 256, 192, 200, DType::kBF16, DType::kBF16, false, true}, 0.5f, 3),
      oai({2048, 32, 4, 0, 264, 200, 208}, 0.6f, 3),  // 8k rows: 128-row tiles
      oai({300, 64, 8, 0, 136, 72, 80, DType::kF16, DType::kF16}, 0.5f, 3),
      oai({37, 8, 2, 1, 128, 64, 64, DType::kF16, DType::kBF16}, 0.5f, 0),  // + a shared slot
      // SiLU·mul with biases takes the extended epilogue too.
      oai({8, 32, 4, 0, 256, 128, 136}, 0.0f, 3),
      oai({300, 32, 4, 0, 256, 128, 136}, 0.0f, 3),
  };
  uint64_t seed = 5000;
  for (const MoeCase& c : cases) check_fused(c, seed += 13);
}

// ---------------------------------------------------------------- MXFP4 experts (W4A16)

// e2m1 code -> value, written out here (not taken from the loader).
float e2m1(uint8_t code) {
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (code & 8) ? -mag[code & 7] : mag[code & 7];
}

// MXFP4 experts in the layout kernels::MoeExperts takes (blocks [S, 2Ip, H/2] and [S, H, Ip/2],
// scales k-group-major [S, H/32, 2Ip] and [S, Ip/32, H]), and the dense weights they encode
// (every product e2m1 * 2^k is exact in BF16). Random codes (all 16, both zeros), scales
// 2^-8 .. 2^-3 and a few edge exponents; the padding rows of w13 and columns of w2 are zero codes
// with random scales.
struct MxExperts {
  Tensor b13, b2, s13, s2;  // host U8
  Tensor d13, d2;           // host, c.dt
};

MxExperts make_mx(const MoeCase& c, uint64_t seed) {
  const int64_t S = c.E + c.shared, H = c.H, Ip = c.I_pad, G13 = H / 32, G2 = Ip / 32;
  std::mt19937_64 rng(seed);
  MxExperts m;
  m.b13 = Tensor::empty({S, 2 * Ip, H / 2}, DType::kU8);
  m.s13 = Tensor::empty({S, G13, 2 * Ip}, DType::kU8);
  m.b2 = Tensor::empty({S, H, Ip / 2}, DType::kU8);
  m.s2 = Tensor::empty({S, G2, H}, DType::kU8);
  Tensor d13 = Tensor::empty({S, 2 * Ip, H}, DType::kF32),
         d2 = Tensor::empty({S, H, Ip}, DType::kF32);
  uint8_t* b13 = static_cast<uint8_t*>(m.b13.data());
  uint8_t* s13 = static_cast<uint8_t*>(m.s13.data());
  uint8_t* b2 = static_cast<uint8_t*>(m.b2.data());
  uint8_t* s2 = static_cast<uint8_t*>(m.s2.data());
  // One group in 16 takes an edge of the kernels' scale handling: 0 (2^-127), 1, 127, 128 (the
  // last of the one-multiply range), 129 and 132 (past it).
  auto scale = [&] {
    static constexpr uint8_t kEdge[6] = {0, 1, 127, 128, 129, 132};
    return rng() % 16 == 0 ? kEdge[rng() % 6] : static_cast<uint8_t>(119 + rng() % 6);
  };
  for (int64_t e = 0; e < S; ++e) {
    for (int64_t r = 0; r < 2 * Ip; ++r) {
      const bool pad = r % Ip >= c.I;
      for (int64_t g = 0; g < G13; ++g) {
        const uint8_t sc = scale();
        s13[(e * G13 + g) * 2 * Ip + r] = sc;
        for (int64_t i = 0; i < 16; ++i) {
          const uint8_t byte = pad ? 0 : static_cast<uint8_t>(rng());
          const int64_t k = g * 32 + 2 * i;
          b13[(e * 2 * Ip + r) * (H / 2) + k / 2] = byte;
          float* d = d13.ptr<float>() + (e * 2 * Ip + r) * H + k;
          d[0] = std::ldexp(e2m1(byte & 15), sc - 127);
          d[1] = std::ldexp(e2m1(byte >> 4), sc - 127);
        }
      }
    }
    for (int64_t h = 0; h < H; ++h)
      for (int64_t g = 0; g < G2; ++g) {
        const uint8_t sc = scale();
        s2[(e * G2 + g) * H + h] = sc;
        for (int64_t i = 0; i < 16; ++i) {
          const int64_t k = g * 32 + 2 * i;
          const uint8_t byte = k >= c.I ? 0 : static_cast<uint8_t>(rng());
          b2[(e * H + h) * (Ip / 2) + k / 2] = byte;
          float* d = d2.ptr<float>() + (e * H + h) * Ip + k;
          d[0] = std::ldexp(e2m1(byte & 15), sc - 127);
          d[1] = std::ldexp(e2m1(byte >> 4), sc - 127);
        }
      }
  }
  m.d13 = tensor_cast_cpu(d13, c.dt);
  m.d2 = tensor_cast_cpu(d2, c.dt);
  return m;
}

// fused_moe over quantised experts (gex: codes, scales and biases on the GPU) for the inputs
// `in` on every path: the tuned default, the grouped GEMMs with both tiles and, up to 512 routed
// rows, the decode kernels at both depths (decode_rows: the tuning's threshold for this storage).
// Each run is checked against the CPU reference on the weights the codes encode (d13, d2 on the
// host; the BF16 cases' 5e-3) and against the GPU's BF16 path on those weights, which takes the
// same path (never the per-slot dense path), within dense_tol; a second run gives the same bytes.
void check_quantized_paths(const MoeCase& c, const std::string& label, const MoeInputs& in,
                           const Tensor& d13, const Tensor& d2, const kernels::MoeExperts& gex,
                           int kernels::cuda::CudaTuning::*decode_rows, double dense_tol) {
  const kernels::MoeExperts ex = experts_of(c, d13, d2, in.b13, in.b2);
  Tensor ref = Tensor::empty({c.T, c.H}, DType::kF32);
  kernels::fused_moe(ref, in.x, ex, in.ids, in.wts, nullptr);
  Tensor gx = in.xw.to(gpu()).narrow(1, c.strided ? 16 : 0, c.H);
  Tensor gd13 = d13.to(gpu()), gd2 = d2.to(gpu());
  Tensor gbias13 = in.b13.defined() ? in.b13.to(gpu()) : Tensor();
  Tensor gbias2 = in.b2.defined() ? in.b2.to(gpu()) : Tensor();
  Tensor gids = in.ids.to(gpu()), gw = in.wts.to(gpu());
  const int64_t KT = c.K + c.shared;
  auto run_quantized = [&] {
    const int64_t bytes = kernels::fused_moe_workspace_bytes(gpu(), c.T, KT, gex, c.dt);
    Tensor ws = Tensor::empty({std::max<int64_t>(bytes, 1)}, DType::kU8, gpu());
    poison(ws);
    Tensor out = Tensor::empty({c.T, c.H}, c.out, gpu());
    poison(out);
    kernels::fused_moe(out, gx, gex, gids, gw, &ws);
    return out;
  };
  const kernels::cuda::CudaTuning& base = kernels::cuda::cuda_tuning();
  struct Path {
    const char* name;
    int decode_rows, tile_rows, depth;
  };
  std::vector<Path> paths = {
      {"auto", base.*decode_rows, base.moe_gemm_tile_rows, base.moe_decode_depth},
      {"gemm64", 0, 64, 2},
      {"gemm128", 0, 128, 2}};
  if (c.T * KT <= 512) {
    paths.push_back({"decode", 512, 0, 2});
    paths.push_back({"decode4", 512, 0, 4});
  }
  for (const Path& p : paths) {
    SCOPED_TRACE(p.name);
    const kernels::cuda::CudaTuningScope scope(
        kernels::cuda::cuda_tuning_with([&](kernels::cuda::CudaTuning& t) {
          t.*decode_rows = p.decode_rows;
          t.moe_decode_max_rows = p.decode_rows;
          t.moe_gemm_tile_rows = p.tile_rows;
          t.moe_decode_depth = p.depth;
          t.moe_dense_min_rows = 0;
        }));
    Tensor out = run_quantized();
    Tensor dense = run_gpu(c, gx, gd13, gd2, gbias13, gbias2, gids, gw);
    const double err = rel_err(host(out), ref), err_dense = rel_err(out, dense);
    EXPECT_LE(err, 5e-3);
    EXPECT_LE(err_dense, dense_tol);
    std::printf("  %s %-52s %-8s err %.2e, vs the BF16 path %.2e%s\n", label.c_str(),
                case_name(c).c_str(), p.name, err, err_dense,
                same_bytes(out, dense) ? " (same bytes)" : "");
    Tensor again = run_quantized();
    EXPECT_TRUE(same_bytes(out, again));
  }
}

// The GPU's MXFP4 path against the CPU reference on the weights the codes encode (the tolerance
// of the BF16 cases) and against the GPU's BF16 path on those same weights, which it must match
// to fp32 summation order (the expansion is exact and the k order is the same), on every path.
void check_fused_mx(const MoeCase& c, uint64_t seed) {
  SCOPED_TRACE("mxfp4 " + case_name(c));
  MoeInputs in = make_inputs(c, seed);
  MxExperts mx = make_mx(c, seed + 77);
  Tensor gb13 = mx.b13.to(gpu()), gb2 = mx.b2.to(gpu()), gs13 = mx.s13.to(gpu()),
         gs2 = mx.s2.to(gpu());
  Tensor gbias13 = in.b13.defined() ? in.b13.to(gpu()) : Tensor();
  Tensor gbias2 = in.b2.defined() ? in.b2.to(gpu()) : Tensor();
  kernels::MoeExperts gex = experts_of(c, gb13, gb2, gbias13, gbias2);
  gex.w13_scales = &gs13;
  gex.w2_scales = &gs2;
  check_quantized_paths(c, "mxfp4", in, mx.d13, mx.d2, gex,
                        &kernels::cuda::CudaTuning::moe_decode_max_rows_mxfp4, 1e-5);
}

// GPT-OSS's experts in MXFP4: the clamped SwiGLU (limits the products cross, and 7), expert
// biases, padded intermediates, partial k steps (H = 288, I = 96: k not a multiple of 64 or 128),
// the gpt_oss fixture's shape, F32 and BF16 outputs, and SiLU·mul without biases.
TEST(GpuMoe, FusedMxfp4MatchesCpu) {
  auto oai = [](MoeCase c, float limit, int biases) {
    c.limit = limit;
    c.biases = biases;
    return c;
  };
  const MoeCase cases[] = {
      oai({1, 32, 4, 0, 256, 128, 128}, 0.5f, 3),
      oai({2, 8, 2, 0, 288, 96, 96, DType::kBF16, DType::kF32}, 0.5f, 1),
      oai({8, 32, 4, 0, 512, 192, 192}, 7.0f, 3),
      oai({16, 4, 2, 0, 64, 96, 96}, 7.0f, 3),  // the gpt_oss fixture's H and I
      oai({48, 8, 2, 0, 128, 64, 64, DType::kBF16, DType::kBF16, true}, 0.0f, 0),
      oai({100, 32, 4, 0, 256, 160, 192}, 0.6f, 3),  // padded I
      oai({600, 32, 4, 0, 320, 192, 192, DType::kBF16, DType::kBF16, false, true}, 0.5f, 2),
      oai({2048, 32, 4, 0, 256, 128, 128}, 0.5f, 3),  // 8k rows: 128-row tiles
  };
  uint64_t seed = 9000;
  for (const MoeCase& c : cases) check_fused_mx(c, seed += 17);
}

// ---------------------------------------------------------------- FP8 experts (W8A16)

// e4m3 code -> value, written out here (not taken from core/half.h): sign, 4 exponent bits (bias
// 7), 3 mantissa bits; exponent 0 is subnormal. The NaN codes (0x7F, 0xFF) are never drawn.
float e4m3_value(uint8_t code) {
  const int e = (code >> 3) & 15, m = code & 7;
  const float mag = e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (code & 0x80) ? -mag : mag;
}

// FP8 experts in the layout kernels::MoeExperts takes (codes [S, 2Ip, H] and [S, H, Ip], F32
// scales per bn x bk block, bk 0: one per row) and the weights they encode, each product rounded
// once to c.dt as the loader's dequantisation rounds it. Random codes over the whole range (both
// zeros and subnormals included, no NaN), scales 2^-12 .. 2^-9 times a random mantissa; the
// padding rows of w13 and columns of w2 are zero codes.
struct F8Experts {
  Tensor c13, c2, s13, s2;  // host F8E4M3 codes and F32 scales
  Tensor d13, d2;           // host, c.dt
};

F8Experts make_f8(const MoeCase& c, int bn, int bk, uint64_t seed) {
  const int64_t S = c.E + c.shared, H = c.H, Ip = c.I_pad;
  auto blocks = [](int64_t n, int64_t b) { return b == 0 ? int64_t{1} : (n + b - 1) / b; };
  std::mt19937_64 rng(seed);
  F8Experts f;
  f.c13 = Tensor::empty({S, 2 * Ip, H}, DType::kF8E4M3);
  f.c2 = Tensor::empty({S, H, Ip}, DType::kF8E4M3);
  f.s13 = Tensor::empty({S, 2 * Ip / bn, blocks(H, bk)}, DType::kF32);
  f.s2 = Tensor::empty({S, blocks(H, bn), blocks(Ip, bk)}, DType::kF32);
  for (Tensor* t : {&f.s13, &f.s2})
    for (int64_t i = 0; i < t->numel(); ++i)
      t->ptr<float>()[i] = std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f,
                                      -12 + static_cast<int>(rng() % 4));
  auto code = [&](bool pad) {
    if (pad) return uint8_t{0};
    uint8_t b;
    do b = static_cast<uint8_t>(rng());
    while ((b & 0x7F) == 0x7F);
    return b;
  };
  Tensor d13 = Tensor::empty({S, 2 * Ip, H}, DType::kF32),
         d2 = Tensor::empty({S, H, Ip}, DType::kF32);
  uint8_t* c13 = static_cast<uint8_t*>(f.c13.data());
  uint8_t* c2 = static_cast<uint8_t*>(f.c2.data());
  const int64_t g13 = blocks(H, bk), g2 = blocks(Ip, bk), r13 = 2 * Ip / bn, r2 = blocks(H, bn);
  for (int64_t e = 0; e < S; ++e) {
    for (int64_t r = 0; r < 2 * Ip; ++r)
      for (int64_t k = 0; k < H; ++k) {
        const int64_t i = (e * 2 * Ip + r) * H + k;
        c13[i] = code(r % Ip >= c.I);
        d13.ptr<float>()[i] =
            e4m3_value(c13[i]) * f.s13.ptr<float>()[(e * r13 + r / bn) * g13 + (bk ? k / bk : 0)];
      }
    for (int64_t h = 0; h < H; ++h)
      for (int64_t k = 0; k < Ip; ++k) {
        const int64_t i = (e * H + h) * Ip + k;
        c2[i] = code(k >= c.I);
        d2.ptr<float>()[i] =
            e4m3_value(c2[i]) * f.s2.ptr<float>()[(e * r2 + h / bn) * g2 + (bk ? k / bk : 0)];
      }
  }
  f.d13 = tensor_cast_cpu(d13, c.dt);
  f.d2 = tensor_cast_cpu(d2, c.dt);
  return f;
}

// The GPU's FP8 path against the CPU reference on the weights the codes encode (the BF16 cases'
// tolerance) and against the GPU's BF16 path on those same BF16 weights, on every path: the
// decode kernel at both depths, the grouped GEMMs with both tiles. Each code expands to the very
// BF16 weight, so the grouped GEMMs give the BF16 path's bytes; the decode kernels hand a lane
// 32 consecutive k (the BF16 kernels four runs of 8), so their fp32 sums differ in order and an
// occasional activation rounds to the neighbouring BF16 value between the two products (measured
// up to 1.2e-5 on an H100, 2026-12-07): bound 1e-4, where a wrong scale or block moves whole
// products (the CPU comparison's 2-3e-3 and more).
void check_fused_f8(const MoeCase& c, int bn, int bk, uint64_t seed) {
  SCOPED_TRACE(fmt::format("fp8 {}x{} {}", bn, bk, case_name(c)));
  MoeInputs in = make_inputs(c, seed);
  F8Experts f8 = make_f8(c, bn, bk, seed + 91);
  Tensor gc13 = f8.c13.to(gpu()), gc2 = f8.c2.to(gpu()), gs13 = f8.s13.to(gpu()),
         gs2 = f8.s2.to(gpu());
  Tensor gbias13 = in.b13.defined() ? in.b13.to(gpu()) : Tensor();
  Tensor gbias2 = in.b2.defined() ? in.b2.to(gpu()) : Tensor();
  kernels::MoeExperts gex = experts_of(c, gc13, gc2, gbias13, gbias2);
  gex.w13_scales = &gs13;
  gex.w2_scales = &gs2;
  gex.fp8_block_n = bn;
  gex.fp8_block_k = bk;
  check_quantized_paths(c, fmt::format("fp8 {}x{}", bn, bk), in, f8.d13, f8.d2, gex,
                        &kernels::cuda::CudaTuning::moe_decode_max_rows_fp8, 1e-4);
}

// FP8 experts: DeepSeek-V3's / Qwen3-FP8's 128x128 blocks (partial edge blocks at H = 192 and
// 320: rows of w2 and k of w13 past the last whole block), 64x64 blocks, per-channel scales
// (blocks of 1 row and the whole k), padded intermediates, a fused shared slot, skewed routing,
// strided rows, F32 outputs, 8k routed rows (128-row tiles), a clamped activation with biases.
TEST(GpuMoe, FusedFp8MatchesCpu) {
  struct F8Case {
    MoeCase c;
    int bn, bk;
  };
  MoeCase clamped{8, 16, 4, 0, 256, 128, 128};
  clamped.limit = 0.5f;
  clamped.silu_clamped = true;
  clamped.biases = 3;
  const F8Case cases[] = {
      {{1, 32, 4, 0, 256, 128, 128}, 128, 128},
      {{2, 8, 2, 0, 192, 64, 64, DType::kBF16, DType::kF32}, 128, 128},
      {{8, 32, 4, 0, 512, 192, 256}, 128, 128},  // padded I
      {{16, 8, 2, 1, 256, 128, 128}, 1, 0},      // per channel, a shared slot
      {{48, 8, 2, 0, 128, 64, 64, DType::kBF16, DType::kBF16, true}, 1, 0},
      {{37, 16, 4, 0, 256, 128, 128}, 64, 64},
      {{100, 32, 4, 0, 256, 128, 128}, 128, 128},
      {{600, 32, 4, 0, 320, 192, 192, DType::kBF16, DType::kBF16, false, true}, 128, 128},
      {{2048, 32, 4, 0, 256, 128, 128}, 128, 128},  // 8k rows: 128-row tiles
      {clamped, 128, 128},
  };
  uint64_t seed = 9500;
  for (const F8Case& f : cases) check_fused_f8(f.c, f.bn, f.bk, seed += 19);
}

// Arguments the FP8 kernels cannot take are refused by name: F16 activations, a block narrower
// than a 64-wide k step, scales of the wrong shape.
TEST(GpuMoe, FusedFp8RejectsWhatItCannotRun) {
  const MoeCase c{4, 8, 2, 0, 256, 128, 128};
  F8Experts f8 = make_f8(c, 128, 128, 1);
  Tensor gc13 = f8.c13.to(gpu()), gc2 = f8.c2.to(gpu()), gs13 = f8.s13.to(gpu()),
         gs2 = f8.s2.to(gpu());
  MoeInputs in = make_inputs(c, 2);
  Tensor gids = in.ids.to(gpu()), gw = in.wts.to(gpu());
  Tensor ws = Tensor::empty({1 << 22}, DType::kU8, gpu());
  Tensor out = Tensor::empty({c.T, c.H}, DType::kBF16, gpu());
  kernels::MoeExperts ex;
  ex.w13 = &gc13;
  ex.w2 = &gc2;
  ex.w13_scales = &gs13;
  ex.w2_scales = &gs2;
  ex.fp8_block_n = 128;
  ex.fp8_block_k = 128;
  Tensor xh = Tensor::zeros({c.T, c.H}, DType::kF16, gpu());
  Tensor outh = Tensor::empty({c.T, c.H}, DType::kF16, gpu());
  EXPECT_ERROR_CONTAINS(kernels::fused_moe(outh, xh, ex, gids, gw, &ws), "FP8 experts",
                        "BF16 activations");
  Tensor x = Tensor::zeros({c.T, c.H}, DType::kBF16, gpu());
  ex.fp8_block_k = 32;  // (the scales' shape too: checked first or second, both name FP8)
  EXPECT_ERROR_CONTAINS(kernels::fused_moe(out, x, ex, gids, gw, &ws), "FP8 experts");
  ex.fp8_block_k = 128;
  ex.fp8_block_n = 64;  // scales for 128-row blocks
  EXPECT_ERROR_CONTAINS(kernels::fused_moe(out, x, ex, gids, gw, &ws), "FP8 experts", "scales");
  ex.fp8_block_n = 128;
  kernels::fused_moe(out, x, ex, gids, gw, &ws);  // and the right ones run
}

// The fused layer loading an FP8 checkpoint on the GPU: its experts stay F8E4M3 with F32 scales
// (this rank's rows of w1 / w3 and columns of w2 with their blocks' scales, padded to 128), and
// its output equals the same layer loaded with ATOM_MOE_FP8_EXPERTS=0 (every expert dequantised
// to BF16 at load, the path the CPU reference's parity tests cover) to the decode kernels' fp32
// summation order (FusedFp8MatchesCpu: measured up to 3.7e-5, bound 1e-4), on the decode path
// and the grouped GEMMs: DeepSeek-V3's 128x128 blocks on one rank and on rank 1 of 2, and
// compressed-tensors' per-channel scales on rank 1 of 2.
TEST(GpuMoe, Fp8ExpertsStayFp8AndComputeTheDequantisedLayer) {
  const int64_t E = 4, H = 256, I = 448;
  const char* block = R"({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                          "weight_block_size": [128, 128]})";
  const char* channel = R"({"quant_method": "compressed-tensors", "format": "float-quantized",
    "quantization_status": "compressed", "ignore": ["lm_head"],
    "config_groups": {"group_0": {"targets": ["Linear"],
      "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": false,
                  "symmetric": true},
      "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                            "dynamic": true, "symmetric": true}}}})";
  struct Case {
    const char* name;
    const char* quant;
    bool channel;
    int tp_rank, tp_size;
    int64_t I;
  };
  // I = 512 splits into two ranks of 256 (whole 128-row blocks); I = 448 on one rank pads to 512.
  const Case cases[] = {{"block 128x128, 1 rank, I 448", block, false, 0, 1, I},
                        {"block 128x128, rank 1 of 2", block, false, 1, 2, 512},
                        {"per channel, rank 1 of 2", channel, true, 1, 2, 512}};
  std::mt19937_64 rng(77);
  auto codes = [&](int64_t n, int64_t k) {
    Tensor t = Tensor::empty({n, k}, DType::kF8E4M3);
    uint8_t* p = static_cast<uint8_t*>(t.data());
    for (int64_t i = 0; i < n * k; ++i) {
      uint8_t b;
      do b = static_cast<uint8_t>(rng());
      while ((b & 0x7F) == 0x7F);
      p[i] = b;
    }
    return t;
  };
  auto scales = [&](int64_t n, int64_t k, bool per_channel) {
    Tensor t = per_channel ? Tensor::empty({n, 1}, DType::kF32)
                           : Tensor::empty({(n + 127) / 128, (k + 127) / 128}, DType::kF32);
    for (int64_t i = 0; i < t.numel(); ++i)
      t.ptr<float>()[i] = std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f, -11);
    return t;
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t Ic = c.I;
    std::vector<std::pair<std::string, Tensor>> ts;
    for (int64_t e = 0; e < E; ++e) {
      const std::string at = "mlp.experts." + std::to_string(e) + ".";
      const char* sn = c.channel ? "weight_scale" : "weight_scale_inv";
      for (const char* part : {"gate_proj", "up_proj"}) {
        ts.emplace_back(at + part + ".weight", codes(Ic, H));
        ts.emplace_back(at + part + "." + sn, scales(Ic, H, c.channel));
      }
      ts.emplace_back(at + "down_proj.weight", codes(H, Ic));
      ts.emplace_back(at + "down_proj." + sn, scales(H, Ic, c.channel));
    }
    TempDir dir;
    safetensors_write(dir.file("model.safetensors"), ts);
    nlohmann::json root =
        nlohmann::json::parse(std::string(R"({"quantization_config": )") + c.quant + "}");
    const QuantizationConfig quant = *quantization_config_parse(ConfigFields(root, "config.json"));
    struct Built {
      ParamRegistry params;
      std::vector<CacheSpec> caches;
      std::vector<StateCacheSpec> states;
      SoloCommunicator solo;
      std::unique_ptr<LayerContext> ctx;
      std::unique_ptr<FusedMoE> moe;
    };
    auto build = [&](Built& b, bool keep_fp8) {
      b.ctx.reset(new LayerContext{b.params, gpu(), DType::kBF16, DType::kBF16, c.tp_rank,
                                   c.tp_size, &b.solo, &b.caches, &b.states, false, &quant,
                                   default_packed_modules(), true});
      FusedMoEOptions o;
      o.num_experts = E;
      o.hidden = H;
      o.intermediate = Ic;
      setenv("ATOM_MOE_FP8_EXPERTS", keep_fp8 ? "1" : "0", 1);
      b.moe = std::make_unique<FusedMoE>(*b.ctx, "mlp.experts", o);
      unsetenv("ATOM_MOE_FP8_EXPERTS");
      WeightLoadSpec spec;
      spec.num_hidden_layers = 1;
      spec.packed_modules = default_packed_modules();
      spec.expert_mapping = fused_moe_expert_mapping("gate_proj", "down_proj", "up_proj", E);
      load_weights(b.params, Checkpoint(dir.str()), spec, {});
    };
    Built f8, bf;
    build(f8, true);
    build(bf, false);
    ASSERT_TRUE(f8.moe->fp8());
    ASSERT_FALSE(bf.moe->fp8());
    const int64_t Ir = Ic / c.tp_size, Ip = (Ir + 127) / 128 * 128;
    EXPECT_EQ(f8.moe->w13().data().dtype(), DType::kF8E4M3);
    EXPECT_EQ(f8.moe->w13().data().shape(), (Shape{E, 2 * Ip, H}));
    EXPECT_EQ(f8.moe->w2().data().shape(), (Shape{E, H, Ip}));
    EXPECT_EQ(bf.moe->w13().data().dtype(), DType::kBF16);
    // The BF16 layer pads to its own multiple; both hold this rank's Ir channels.
    for (const int64_t T : {int64_t{3}, int64_t{200}}) {
      const int K = 2;
      Tensor x = random_cpu({T, H}, DType::kBF16, 5 + T, -1, 1).to(gpu());
      Tensor ids = Tensor::empty({T, K}, DType::kI32), wts = Tensor::empty({T, K}, DType::kF32);
      for (int64_t i = 0; i < T * K; ++i) {
        ids.ptr<int32_t>()[i] = static_cast<int32_t>((i / K + (i % K) * 3) % E);
        wts.ptr<float>()[i] = 0.25f + 0.5f * static_cast<float>(i % 2);
      }
      Tensor gids = ids.to(gpu()), gw = wts.to(gpu());
      auto run = [&](Built& b) {
        Batch batch;
        Arena arena(gpu());
        Step step{batch, arena};
        Tensor out = Tensor::empty({T, H}, DType::kBF16, gpu());
        b.moe->forward(step, x, gids, gw, out);
        return f32_host(out);
      };
      const Tensor a = run(f8), d = run(bf);
      const double err = rel_err(a, d);
      std::printf("  fp8 layer %-32s T=%lld: rel err vs dequantised at load %.2e\n", c.name,
                  static_cast<long long>(T), err);
      EXPECT_LE(err, 1e-4);
      double norm = 0;
      for (int64_t i = 0; i < a.numel(); ++i) norm += std::abs(a.ptr<float>()[i]);
      EXPECT_GT(norm, 1.0);  // not a zero layer
    }
  }
}

TEST(GpuMoe, FusedRejectsWhatItCannotRun) {
  Tensor x = Tensor::empty({2, 100}, DType::kBF16, gpu());
  Tensor w13 = Tensor::empty({4, 64, 100}, DType::kBF16, gpu());
  Tensor w2 = Tensor::empty({4, 100, 32}, DType::kBF16, gpu());
  Tensor ids = Tensor::zeros({2, 2}, DType::kI32, gpu()),
         wts = Tensor::zeros({2, 2}, DType::kF32, gpu());
  Tensor out = Tensor::empty({2, 100}, DType::kBF16, gpu());
  kernels::MoeExperts ex;
  ex.w13 = &w13;
  ex.w2 = &w2;
  Tensor ws = Tensor::empty({1 << 20}, DType::kU8, gpu());
  EXPECT_THROW(kernels::fused_moe(out, x, ex, ids, wts, &ws), Error);  // H % 8 != 0
  Tensor xf = Tensor::empty({2, 128}, DType::kF32, gpu());
  Tensor w13f = Tensor::empty({4, 64, 128}, DType::kF32, gpu());
  Tensor w2f = Tensor::empty({4, 128, 32}, DType::kF32, gpu());
  Tensor outf = Tensor::empty({2, 128}, DType::kF32, gpu());
  ex.w13 = &w13f;
  ex.w2 = &w2f;
  EXPECT_THROW(kernels::fused_moe(outf, xf, ex, ids, wts, &ws), Error);  // F32 activations
  Tensor xb = Tensor::empty({2, 128}, DType::kBF16, gpu());
  Tensor w13b = Tensor::empty({4, 64, 128}, DType::kBF16, gpu());
  Tensor w2b = Tensor::empty({4, 128, 32}, DType::kBF16, gpu());
  ex.w13 = &w13b;
  ex.w2 = &w2b;
  Tensor small = Tensor::empty({16}, DType::kU8, gpu());
  EXPECT_THROW(kernels::fused_moe(outf, xb, ex, ids, wts, &small), Error);  // workspace too small
  Tensor b13 = Tensor::empty({4, 64}, DType::kF32, gpu());  // F32 bias for BF16 weights
  ex.w13_bias = &b13;
  EXPECT_THROW(kernels::fused_moe(outf, xb, ex, ids, wts, &ws), Error);
  Tensor b2 = Tensor::empty({4, 64}, DType::kBF16, gpu());  // [S, I] instead of [S, H]
  ex.w13_bias = nullptr;
  ex.w2_bias = &b2;
  EXPECT_THROW(kernels::fused_moe(outf, xb, ex, ids, wts, &ws), Error);
}

// route + fused_moe captured for a bucket, replayed with other logits (other routing) and other
// activations: the same bytes as eager calls on those inputs.
// Under capture fused_moe never takes the dense path (it reads the tile table on the host): with
// the dense path forced, the capture still succeeds and replays the grouped GEMMs' bytes.
TEST(GpuMoe, GraphReplayMatchesEager) {
  for (const auto& tc : {std::pair<int64_t, bool>{8, false}, {256, false}, {256, true}}) {
    const int64_t T = tc.first;
    const bool force_dense = tc.second;
    SCOPED_TRACE("T=" + std::to_string(T) + (force_dense ? " dense forced" : ""));
    auto dense_rows = [](int rows) {
      return kernels::cuda::cuda_tuning_with([&](kernels::cuda::CudaTuning& t) {
        t.moe_dense_min_rows = rows;
        t.moe_dense_max_slots = kernels::cuda::kMoeMaxSlots;
      });
    };
    const int64_t E = 64, K = 6, H = 256, I = 128, S = E + 1, KT = K + 1;
    Tensor w13 = random_cpu({S, 2 * I, H}, DType::kBF16, 1, -0.1f, 0.1f).to(gpu());
    Tensor w2 = random_cpu({S, H, I}, DType::kBF16, 2, -0.1f, 0.1f).to(gpu());
    kernels::MoeExperts ex;
    ex.w13 = &w13;
    ex.w2 = &w2;
    const RouterArgs ra = softmax(K, true, 1, static_cast<int>(E));
    CudaStream stream(0);
    CudaStreamGuard guard(stream.get());
    Tensor logits = Tensor::empty({T, E}, DType::kF32, gpu());
    Tensor x = Tensor::empty({T, H}, DType::kBF16, gpu());
    Tensor ids = Tensor::empty({T, KT}, DType::kI32, gpu());
    Tensor wts = Tensor::empty({T, KT}, DType::kF32, gpu());
    Tensor out = Tensor::empty({T, H}, DType::kBF16, gpu());
    Tensor ws = Tensor::empty(
        {std::max<int64_t>(1, kernels::fused_moe_workspace_bytes(gpu(), T, KT, ex, DType::kBF16))},
        DType::kU8, gpu());
    auto step = [&] {
      kernels::moe_route(ids, wts, logits, Tensor(), ra);
      kernels::fused_moe(out, x, ex, ids, wts, &ws);
    };
    // Eager on the second inputs, on the grouped GEMMs: the reference.
    logits.copy_from(random_cpu({T, E}, DType::kF32, 20, -3, 3));
    x.copy_from(random_cpu({T, H}, DType::kBF16, 21));
    {
      const kernels::cuda::CudaTuningScope grouped(dense_rows(0));
      step();
    }
    stream.synchronize();
    Tensor ref = host(out), ref_ids = host(ids);
    const kernels::cuda::CudaTuningScope scope(dense_rows(force_dense ? 1 : 0));
    // Capture on the first inputs.
    logits.copy_from(random_cpu({T, E}, DType::kF32, 10, -3, 3));
    x.copy_from(random_cpu({T, H}, DType::kBF16, 11));
    step();  // warm-up outside the capture
    stream.synchronize();
    cudaGraphExec_t exec = capture_graph(stream.get(), step);
    logits.copy_from(random_cpu({T, E}, DType::kF32, 20, -3, 3));
    x.copy_from(random_cpu({T, H}, DType::kBF16, 21));
    CUDA_CHECK(cudaMemsetAsync(out.data(), 0xff, out.nbytes(), stream.get()));
    CUDA_CHECK(cudaMemsetAsync(ws.data(), 0xff, ws.nbytes(), stream.get()));
    CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));
    CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));  // twice: the tickets reset themselves
    stream.synchronize();
    cudaGraphExecDestroy(exec);
    EXPECT_TRUE(same_bytes(ids, ref_ids));
    EXPECT_TRUE(same_bytes(out, ref));
    EXPECT_LT(rel_err(out, ref), 1e-6);
  }
}

}  // namespace
}  // namespace atom::test
