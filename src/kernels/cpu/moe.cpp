#include "kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/access.h"

namespace atom::kernels {

void moe_route_check(const Tensor& ids, const Tensor& weights, const Tensor& logits,
                     const Tensor& bias, const RouterArgs& a) {
  using cpu::check_rows;
  check_rows("moe_route", logits, "logits");
  ATOM_CHECK(logits.dtype() == DType::kF32, "moe_route: logits must be F32, got {}", logits.str());
  const int64_t T = logits.size(0), E = logits.size(1);
  const int64_t KT = a.top_k + a.num_fused_shared;
  ATOM_CHECK(a.top_k >= 1 && a.top_k <= E, "moe_route: top_k {} for {} experts", a.top_k, E);
  ATOM_CHECK(a.num_fused_shared >= 0, "moe_route: num_fused_shared {}", a.num_fused_shared);
  // With replicas the range is of physical experts (E plus the redundant ones).
  ATOM_CHECK(a.local_count == -1 || (a.local_first >= 0 && a.local_count >= 1 &&
                                     (a.replicas || a.local_first + a.local_count <= E)),
             "moe_route: this rank's experts [{}, {} + {}) are not a range of the {} experts",
             a.local_first, a.local_first, a.local_count, E);
  ATOM_CHECK(!a.replicas == !a.replica_count, "moe_route: replicas and replica_count go together");
  if (a.replicas)
    ATOM_CHECK(
        a.replicas->dtype() == DType::kI32 && a.replicas->dim() == 2 && a.replicas->size(0) == E &&
            a.replicas->is_contiguous() && a.replica_count->dtype() == DType::kI32 &&
            a.replica_count->numel() == E && a.replica_count->is_contiguous(),
        "moe_route: replicas {} and replica_count {} must be contiguous I32 [{}, R] and [{}]",
        a.replicas->str(), a.replica_count->str(), E, E);
  if (a.expert_load)
    ATOM_CHECK(a.expert_load->dtype() == DType::kI64 && a.expert_load->numel() == E &&
                   a.expert_load->is_contiguous(),
               "moe_route: expert_load {} must be contiguous I64 [{}]", a.expert_load->str(), E);
  ATOM_CHECK(ids.dtype() == DType::kI32 && ids.is_contiguous() && ids.dim() == 2 &&
                 ids.size(0) == T && ids.size(1) == KT,
             "moe_route: topk_ids {} must be contiguous I32 [{}, {}]", ids.str(), T, KT);
  ATOM_CHECK(weights.dtype() == DType::kF32 && weights.is_contiguous() && weights.dim() == 2 &&
                 weights.size(0) == T && weights.size(1) == KT,
             "moe_route: topk_weights {} must be contiguous F32 [{}, {}]", weights.str(), T, KT);
  ATOM_CHECK(a.n_group >= 1 && E % a.n_group == 0 && a.topk_group >= 1 && a.topk_group <= a.n_group,
             "moe_route: {} experts in {} groups keeping {}", E, a.n_group, a.topk_group);
  ATOM_CHECK(a.n_group == 1 || a.topk_group * (E / a.n_group) >= a.top_k,
             "moe_route: {} kept groups of {} experts hold fewer than top_k {}", a.topk_group,
             E / a.n_group, a.top_k);
  ATOM_CHECK(a.n_group == 1 || a.group_score == GroupScore::kMax || E / a.n_group >= 2,
             "moe_route: groups of one expert have no top-2 sum");
  if (a.fixed_ids)
    ATOM_CHECK(a.fixed_ids->dtype() == DType::kI32 && a.fixed_ids->is_contiguous() &&
                   a.fixed_ids->shape() == Shape({T, a.top_k}),
               "moe_route: fixed_ids {} must be contiguous I32 [{}, {}]", a.fixed_ids->str(), T,
               a.top_k);
  if (a.fixed_ids && a.fixed_ids->device().is_cpu())
    for (int64_t i = 0; i < a.fixed_ids->numel(); ++i) {
      const int32_t e = a.fixed_ids->ptr<int32_t>()[i];
      ATOM_CHECK(e >= 0 && e < E, "moe_route: fixed expert {} of token row {} is not one of the {}",
                 e, i / a.top_k, E);
    }
  if (bias.defined()) {
    ATOM_CHECK(a.scoring == RouterScoring::kSigmoid || a.scoring == RouterScoring::kSqrtSoftplus,
               "moe_route: a correction bias needs sigmoid or sqrt-softplus scoring");
    ATOM_CHECK(bias.dtype() == DType::kF32 && bias.numel() == E && bias.is_contiguous(),
               "moe_route: correction bias {} must be contiguous F32 [{}]", bias.str(), E);
  }
}

int64_t MoeExperts::hidden() const { return w2 ? w2->size(1) : 0; }
int64_t MoeExperts::intermediate() const { return w13 ? w13->size(1) / 2 : 0; }

void fused_moe_check(const Tensor& out, const Tensor& x, const MoeExperts& w,
                     const Tensor& topk_ids, const Tensor& topk_weights) {
  using cpu::check_rows;
  check_rows("fused_moe", out, "out");
  check_rows("fused_moe", x, "x");
  ATOM_CHECK(w.w13 && w.w2, "fused_moe: expert weights missing");
  const Tensor& w13 = *w.w13;
  const Tensor& w2 = *w.w2;
  ATOM_CHECK(w13.dim() == 3 && w13.is_contiguous() && w2.dim() == 3 && w2.is_contiguous(),
             "fused_moe: w13 {} and w2 {} must be contiguous [S, 2I, H] and [S, H, I]", w13.str(),
             w2.str());
  const int64_t T = x.size(0), H = x.size(1), S = w13.size(0), I = w13.size(1) / 2;
  if (w.mxfp4()) {
    ATOM_CHECK(w.w13_scales && w.w2_scales, "fused_moe: MXFP4 experts need both w13_scales and "
                                            "w2_scales");
    const Tensor& s13 = *w.w13_scales;
    const Tensor& s2 = *w.w2_scales;
    const Shape want13{S, H / 32, 2 * I}, want2{S, I / 32, H};
    ATOM_CHECK(w13.dtype() == DType::kU8 && w2.dtype() == DType::kU8 && s13.dtype() == DType::kU8 &&
                   s2.dtype() == DType::kU8 && s13.is_contiguous() && s2.is_contiguous() &&
                   H % 32 == 0 && I % 32 == 0 && w13.size(1) == 2 * I && w13.size(2) == H / 2 &&
                   w2.size(0) == S && w2.size(1) == H && w2.size(2) == I / 2 &&
                   s13.shape() == want13 && s2.shape() == want2,
               "fused_moe: MXFP4 experts for x {}: blocks w13 {} and w2 {} must be U8 [S, 2I, H/2] "
               "and [S, H, I/2], scales w13 {} and w2 {} U8 [S, H/32, 2I] and [S, I/32, H], with "
               "H and I multiples of 32",
               x.str(), w13.str(), w2.str(), s13.str(), s2.str());
  } else if (w.fp8()) {
    ATOM_CHECK(w.w13_scales && w.w2_scales && w.fp8_block_n >= 1 && w.fp8_block_k >= 0,
               "fp8 experts need w13_scales, w2_scales and a block of at least 1 row (got {} x {})",
               w.fp8_block_n, w.fp8_block_k);
    const Tensor& s13 = *w.w13_scales;
    const Tensor& s2 = *w.w2_scales;
    const int64_t bn = w.fp8_block_n, bk = w.fp8_block_k;
    const Shape want13{S, 2 * I / bn, MoeExperts::fp8_blocks(H, bk)},
        want2{S, MoeExperts::fp8_blocks(H, bn), MoeExperts::fp8_blocks(I, bk)};
    ATOM_CHECK(w13.dtype() == DType::kF8E4M3 && w2.dtype() == DType::kF8E4M3 &&
                   s13.dtype() == DType::kF32 && s2.dtype() == DType::kF32 && s13.is_contiguous() &&
                   s2.is_contiguous() && w13.size(1) == 2 * I && w13.size(2) == H &&
                   w2.size(0) == S && w2.size(1) == H && w2.size(2) == I && (2 * I) % bn == 0 &&
                   s13.shape() == want13 && s2.shape() == want2,
               "fused_moe: FP8 experts for x {}: codes w13 {} and w2 {} must be F8E4M3 [S, 2I, H] "
               "and [S, H, I], scales w13 {} and w2 {} F32 {} and {} ({} x {} blocks)",
               x.str(), w13.str(), w2.str(), s13.str(), s2.str(), shape_str(want13),
               shape_str(want2), bn, bk);
  } else {
    ATOM_CHECK(w13.size(1) == 2 * I && w13.size(2) == H && w2.size(0) == S && w2.size(1) == H &&
                   w2.size(2) == I,
               "fused_moe: x {} with w13 {} and w2 {}", x.str(), w13.str(), w2.str());
  }
  ATOM_CHECK(out.size(0) == T && out.size(1) == H, "fused_moe: out {} for x {}", out.str(),
             x.str());
  ATOM_CHECK(topk_ids.dtype() == DType::kI32 && topk_ids.is_contiguous() && topk_ids.dim() == 2 &&
                 topk_ids.size(0) == T,
             "fused_moe: topk_ids {} for {} tokens", topk_ids.str(), T);
  ATOM_CHECK(topk_weights.dtype() == DType::kF32 && topk_weights.is_contiguous() &&
                 topk_weights.shape() == topk_ids.shape(),
             "fused_moe: topk_weights {} for topk_ids {}", topk_weights.str(), topk_ids.str());
  glu_check("fused_moe", w.activation);
  ATOM_CHECK(!w.w13_bias || (w.w13_bias->is_contiguous() && w.w13_bias->shape() == Shape{S, 2 * I}),
             "fused_moe: w13 bias {} for w13 {}", w.w13_bias ? w.w13_bias->str() : "", w13.str());
  ATOM_CHECK(!w.w2_bias || (w.w2_bias->is_contiguous() && w.w2_bias->shape() == Shape{S, H}),
             "fused_moe: w2 bias {} for w2 {}", w.w2_bias ? w.w2_bias->str() : "", w2.str());
}

}  // namespace atom::kernels

namespace atom::kernels::cpu {

namespace {

// Index of the largest value of v over entries not taken; ties go to the lower index.
int64_t argmax_untaken(const std::vector<float>& v, const std::vector<char>& taken) {
  int64_t best = -1;
  for (int64_t e = 0; e < static_cast<int64_t>(v.size()); ++e)
    if (!taken[e] && (best < 0 || v[e] > v[best])) best = e;
  return best;
}

}  // namespace

void moe_route(Tensor& topk_ids, Tensor& topk_weights, const Tensor& logits,
               const Tensor& correction_bias, const RouterArgs& a) {
  moe_route_check(topk_ids, topk_weights, logits, correction_bias, a);
  const int64_t T = logits.size(0), E = logits.size(1), K = a.top_k;
  const int64_t KT = K + a.num_fused_shared;
  const int64_t G = a.n_group, per_group = E / G;
  const float* bias = correction_bias.defined() ? correction_bias.ptr<float>() : nullptr;
#pragma omp parallel if (T * E > kParallelMin)
  {
    std::vector<float> score(E), choice(E), group(G);
    std::vector<char> taken(E), group_taken(G);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      row_to_float(logits, t, score.data());
      if (a.scoring == RouterScoring::kSoftmax) {
        float mx = -std::numeric_limits<float>::infinity();
        for (float v : score) mx = std::max(mx, v);
        float sum = 0;
        for (float& v : score) sum += (v = std::exp(v - mx));
        for (float& v : score) v /= sum;
      } else if (a.scoring == RouterScoring::kSigmoid) {
        for (float& v : score) v = 1.0f / (1.0f + std::exp(-v));
      } else if (a.scoring == RouterScoring::kSqrtSoftplus) {  // torch's softplus: x past 20
        for (float& v : score) v = std::sqrt(v > 20.0f ? v : std::log1p(std::exp(v)));
      }
      for (int64_t e = 0; e < E; ++e) choice[e] = score[e] + (bias ? bias[e] : 0.0f);
      if (G > 1) {
        for (int64_t g = 0; g < G; ++g) {
          const float* c = choice.data() + g * per_group;
          if (a.group_score == GroupScore::kMax) {
            float m = c[0];
            for (int64_t i = 1; i < per_group; ++i) m = c[i] > m ? c[i] : m;
            group[g] = m;
          } else {  // the two largest (transformers: topk(2).sum)
            int64_t i0 = 0;
            for (int64_t i = 1; i < per_group; ++i)
              if (c[i] > c[i0]) i0 = i;
            int64_t i1 = -1;
            for (int64_t i = 0; i < per_group; ++i)
              if (i != i0 && (i1 < 0 || c[i] > c[i1])) i1 = i;
            group[g] = c[i0] + c[i1];
          }
        }
        std::fill(group_taken.begin(), group_taken.end(), 0);
        for (int64_t k = 0; k < a.topk_group; ++k)
          group_taken[argmax_untaken(group, group_taken)] = 1;
        for (int64_t e = 0; e < E; ++e)
          if (!group_taken[e / per_group]) choice[e] = -std::numeric_limits<float>::infinity();
      }
      std::fill(taken.begin(), taken.end(), 0);
      int32_t* ids = topk_ids.ptr<int32_t>() + t * KT;
      float* w = topk_weights.ptr<float>() + t * KT;
      const int32_t* fixed = a.fixed_ids ? a.fixed_ids->ptr<int32_t>() + t * K : nullptr;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = fixed ? fixed[k] : argmax_untaken(choice, taken);  // checked in range
        taken[e] = 1;
        ids[k] = static_cast<int32_t>(e);
        w[k] = a.scoring == RouterScoring::kTopKThenSoftmax ? choice[e] : score[e];
      }
      if (a.scoring == RouterScoring::kTopKThenSoftmax) {  // softmax over the k chosen logits
        float mx = w[0], sum = 0;                          // w[0] is the largest
        for (int64_t k = 0; k < K; ++k) sum += (w[k] = std::exp(w[k] - mx));
        for (int64_t k = 0; k < K; ++k) w[k] /= sum;
      }
      if (a.renormalize) {
        float sum = 0;
        for (int64_t k = 0; k < K; ++k) sum += w[k];
        if (a.scoring == RouterScoring::kSigmoid || a.scoring == RouterScoring::kSqrtSoftplus)
          sum += 1e-20f;  // as transformers
        for (int64_t k = 0; k < K; ++k) w[k] /= sum;
      }
      for (int64_t k = 0; k < K; ++k) w[k] *= a.routed_scaling_factor;
      if (a.expert_load)
        for (int64_t k = 0; k < K; ++k) {
#pragma omp atomic
          a.expert_load->ptr<int64_t>()[ids[k]] += 1;
        }
      if (a.replicas) {
        const int64_t R = a.replicas->size(1);
        const int32_t* rep = a.replicas->ptr<int32_t>();
        const int32_t* cnt = a.replica_count->ptr<int32_t>();
        for (int64_t k = 0; k < K; ++k) ids[k] = rep[ids[k] * R + t % cnt[ids[k]]];
      }
      if (a.local_count != -1)
        for (int64_t k = 0; k < K; ++k)
          ids[k] = ids[k] >= a.local_first && ids[k] < a.local_first + a.local_count
                       ? ids[k] - a.local_first
                       : -1;
      for (int64_t s = 0; s < a.num_fused_shared; ++s) {
        ids[K + s] = a.shared_slot_first + static_cast<int32_t>(s);
        w[K + s] = 1.0f;
      }
    }
  }
}

namespace {
// w [N, K] (slot e's codes as floats) *= its F32 block scales [S, ceil(N / bn), gk] (bk 0: one
// per row).
void fp8_scale_slot(float* w, const Tensor& scales, int64_t e, int64_t N, int64_t K, int64_t bn,
                    int64_t bk) {
  const int64_t gk = MoeExperts::fp8_blocks(K, bk);
  const float* s = scales.ptr<float>() + e * MoeExperts::fp8_blocks(N, bn) * gk;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) w[n * K + k] *= s[(n / bn) * gk + (bk ? k / bk : 0)];
}
}  // namespace

void fused_moe(Tensor& out, const Tensor& x, const MoeExperts& w, const Tensor& topk_ids,
               const Tensor& topk_weights, Tensor* workspace) {
  fused_moe_check(out, x, w, topk_ids, topk_weights);
  ATOM_CHECK(!w.mxfp4(), "fused_moe: the CPU takes dense or FP8 expert weights (MXFP4 "
                         "checkpoints are dequantised at load on the CPU)");
  const Tensor& w13 = *w.w13;
  const Tensor& w2 = *w.w2;
  const int64_t T = x.size(0), H = x.size(1), S = w13.size(0), I = w13.size(1) / 2;
  const int64_t K = topk_ids.size(1);
  const int32_t* ids = topk_ids.ptr<int32_t>();
  const float* wts = topk_weights.ptr<float>();

  // Tokens of each slot, so that each expert's weights are converted once.
  std::vector<std::vector<int64_t>> routed(static_cast<size_t>(S));  // (t * K + j)
  for (int64_t r = 0; r < T * K; ++r) {
    const int32_t e = ids[r];
    if (e == -1) continue;  // an expert another rank holds
    ATOM_CHECK(e >= 0 && e < S, "fused_moe: token {} chose slot {} of {}", r / K, e, S);
    routed[e].push_back(r);
  }
  std::vector<float> xf(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) row_to_float(x, t, xf.data() + t * H);
  // y[(t, j)] = expert output before weighting; summed per token in j order below.
  std::vector<float> y(static_cast<size_t>(T * K * H));
  const int64_t w13_slot = 2 * I * H, w2_slot = H * I;
#pragma omp parallel if (T * K * 3 * I * H > kParallelMin * 16)
  {
    std::vector<float> w13f(static_cast<size_t>(w13_slot)), w2f(static_cast<size_t>(w2_slot));
    std::vector<float> gu(static_cast<size_t>(2 * I)), act(static_cast<size_t>(I));
    std::vector<float> b13(static_cast<size_t>(2 * I), 0.0f), b2(static_cast<size_t>(H), 0.0f);
    const Glu glu = w.activation;
#pragma omp for schedule(dynamic)
    for (int64_t e = 0; e < S; ++e) {
      if (routed[e].empty()) continue;
      for (int64_t i = 0; i < w13_slot; ++i)
        w13f[i] = load(w13.data(), w13.dtype(), e * w13_slot + i);
      for (int64_t i = 0; i < w2_slot; ++i) w2f[i] = load(w2.data(), w2.dtype(), e * w2_slot + i);
      if (w.fp8()) {  // float(code) * scale: the very values of the checkpoint dequantised at load
        fp8_scale_slot(w13f.data(), *w.w13_scales, e, 2 * I, H, w.fp8_block_n, w.fp8_block_k);
        fp8_scale_slot(w2f.data(), *w.w2_scales, e, H, I, w.fp8_block_n, w.fp8_block_k);
      }
      if (w.w13_bias)
        for (int64_t n = 0; n < 2 * I; ++n)
          b13[n] = load(w.w13_bias->data(), w.w13_bias->dtype(), e * 2 * I + n);
      if (w.w2_bias)
        for (int64_t h = 0; h < H; ++h)
          b2[h] = load(w.w2_bias->data(), w.w2_bias->dtype(), e * H + h);
      for (const int64_t r : routed[e]) {
        const float* xr = xf.data() + (r / K) * H;
        for (int64_t n = 0; n < 2 * I; ++n) gu[n] = dot(xr, w13f.data() + n * H, H) + b13[n];
        for (int64_t i = 0; i < I; ++i) act[i] = glu_value(gu[i], gu[I + i], glu);
        float* yr = y.data() + r * H;
        for (int64_t h = 0; h < H; ++h) yr[h] = dot(act.data(), w2f.data() + h * I, I) + b2[h];
      }
    }
  }
  std::vector<float> acc(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j = 0; j < K; ++j) {
      if (ids[t * K + j] == -1) continue;
      const float wt = wts[t * K + j];
      const float* yr = y.data() + (t * K + j) * H;
      for (int64_t h = 0; h < H; ++h) acc[h] += wt * yr[h];
    }
    float_to_row(out, t, acc.data());
  }
}

}  // namespace atom::kernels::cpu
