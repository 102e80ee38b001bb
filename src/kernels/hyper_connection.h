// Manifold-constrained hyper-connections (mHC; DeepSeek-V4, GLM-5.3): the maps of layers/
// hyper_connection.h over hc residual streams, in fp32.
//   streams [T, hc, D] F32 contiguous (the residual: it stays fp32 on every backend)
//   f = x.flatten() · rsqrt(mean(x²) + norm_eps); m = f · fnᵀ (fn [rows, hc D] F32)
// hc_mix: rows = (2 + hc) hc; base [rows] and scale [3] F32:
//   pre  = sigmoid(m[0:hc] scale0 + base[0:hc]) + hc_eps
//   post = 2 sigmoid(m[hc:2hc] scale1 + base[hc:2hc])                         -> post [T, hc] F32
//   comb = softmax_row(m[2hc:].view(hc, hc) scale2 + base[2hc:]) + hc_eps, then columns, then
//          (sinkhorn_iters - 1) times rows and columns normalised (each sum + hc_eps)
//                                                                             -> comb [T, hc, hc]
//   input = Σ_j pre_j x_j                                  -> input [T, D] (any float dtype)
//   DeepSeek-V4.1's single-pass form (HcCarry): input = Σ_j by_j x_j by the previous site's pre
//   (by [T, hc] F32), and this site's pre written to pre_out [T, hc] F32.
// hc_write_back: x'_k = post_k y + Σ_j comb[j, k] x_j, in place; y [T, D] any float dtype.
// hc_head: out = Σ_j w_j x_j with w = sigmoid(m scale0 + base) + hc_eps (fn [hc, hc D], base
//   [hc], scale [1]), or w = 1 / hc when fn is undefined (the mean); out [T, D] any float dtype.
// hc_collapse: out = Σ_j by_j x_j (by [T, hc] F32; V4.1's last collapse, by the last site's pre).
// hc_expand: every stream the embedding, streams[t, j] = e[t]; e [T, D] any float dtype.
#pragma once

#include "kernels/dispatch.h"

namespace atom::kernels {

struct HcArgs {
  int hc = 4;
  int sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;
};

// hc_mix's single-pass form (null: none): collapse by `by` instead of the site's own pre, and
// write the site's pre to `pre_out`.
struct HcCarry {
  const Tensor* by = nullptr;
  Tensor* pre_out = nullptr;
};

// The shape and dtype checks of every backend (each adds its own limits).
namespace hc_checks {
inline void streams(const char* op, const Tensor& x) {
  ATOM_CHECK(x.dtype() == DType::kF32 && x.is_contiguous() && x.dim() == 3,
             "{}: streams {} must be contiguous F32 [T, hc, D]", op, x.str());
}
inline void streams(const char* op, const Tensor& x, int hc) {
  ATOM_CHECK(x.dtype() == DType::kF32 && x.is_contiguous() && x.dim() == 3 && x.size(1) == hc,
             "{}: streams {} must be contiguous F32 [T, {}, D]", op, x.str(), hc);
}
// [T, D] rows of the sublayer's side (rows may be strided, columns contiguous).
inline void rows(const char* op, const Tensor& t, const char* name, const Tensor& x) {
  ATOM_CHECK(t.dim() == 2 && (t.size(1) <= 1 || t.stride(1) == 1) &&
                 t.shape() == Shape({x.size(0), x.size(2)}),
             "{}: {} {} for streams {}: expected [T, D] with contiguous rows", op, name, t.str(),
             x.str());
}
inline void params(const char* op, const Tensor& fn, const Tensor& base, const Tensor& scale,
                   int64_t rows, int64_t n, int64_t scales) {
  ATOM_CHECK(fn.dtype() == DType::kF32 && fn.is_contiguous() && fn.shape() == Shape({rows, n}) &&
                 base.dtype() == DType::kF32 && base.numel() == rows && base.is_contiguous() &&
                 scale.dtype() == DType::kF32 && scale.numel() == scales,
             "{}: fn {} base {} scale {}: expected F32 [{}, {}], [{}], [{}]", op, fn.str(),
             base.str(), scale.str(), rows, n, rows, scales);
}
inline void maps(const char* op, const Tensor& post, const Tensor& comb, const Tensor& x) {
  const int64_t T = x.size(0), hc = x.size(1);
  ATOM_CHECK(post.dtype() == DType::kF32 && post.is_contiguous() &&
                 post.shape() == Shape({T, hc}) && comb.dtype() == DType::kF32 &&
                 comb.is_contiguous() && comb.shape() == Shape({T, hc, hc}),
             "{}: post {} comb {} for streams {}", op, post.str(), comb.str(), x.str());
}
inline void mix(const Tensor& input, const Tensor& post, const Tensor& comb, const Tensor& x,
                const Tensor& fn, const Tensor& base, const Tensor& scale, const HcArgs& a) {
  streams("hc_mix", x, a.hc);
  ATOM_CHECK(a.sinkhorn_iters >= 1, "hc_mix: {} Sinkhorn iterations", a.sinkhorn_iters);
  params("hc_mix", fn, base, scale, (2 + int64_t{a.hc}) * a.hc, a.hc * x.size(2), 3);
  rows("hc_mix", input, "input", x);
  maps("hc_mix", post, comb, x);
}
// A [T, hc] F32 map of the streams' tokens (HcCarry's, hc_collapse's).
inline void weights(const char* op, const Tensor* w, const char* name, const Tensor& x) {
  if (!w) return;
  ATOM_CHECK(w->dtype() == DType::kF32 && w->is_contiguous() &&
                 w->shape() == Shape({x.size(0), x.size(1)}),
             "{}: {} {} for streams {}: expected contiguous F32 [T, hc]", op, name, w->str(),
             x.str());
}
inline void carry(const HcCarry& c, const Tensor& x) {
  weights("hc_mix", c.by, "the carried pre", x);
  weights("hc_mix", c.pre_out, "pre_out", x);
}
inline void collapse(const Tensor& out, const Tensor& x, const Tensor& by) {
  streams("hc_collapse", x);
  rows("hc_collapse", out, "out", x);
  weights("hc_collapse", &by, "weights", x);
}
inline void write_back(const Tensor& x, const Tensor& y, const Tensor& post, const Tensor& comb) {
  streams("hc_write_back", x);
  rows("hc_write_back", y, "sublayer output", x);
  maps("hc_write_back", post, comb, x);
}
inline void head(const Tensor& out, const Tensor& x, const Tensor& fn, const Tensor& base,
                 const Tensor& scale, const HcArgs& a) {
  streams("hc_head", x, a.hc);
  if (fn.defined()) params("hc_head", fn, base, scale, a.hc, a.hc * x.size(2), 1);
  rows("hc_head", out, "out", x);
}
inline void expand(const Tensor& x, const Tensor& e) {
  streams("hc_expand", x);
  rows("hc_expand", e, "embeddings", x);
}
}  // namespace hc_checks

namespace cpu {
void hc_mix(Tensor& input, Tensor& post, Tensor& comb, const Tensor& streams, const Tensor& fn,
            const Tensor& base, const Tensor& scale, const HcArgs& a, const HcCarry& carry);
void hc_collapse(Tensor& out, const Tensor& streams, const Tensor& by);
void hc_write_back(Tensor& streams, const Tensor& y, const Tensor& post, const Tensor& comb);
void hc_head(Tensor& out, const Tensor& streams, const Tensor& fn, const Tensor& base,
             const Tensor& scale, const HcArgs& a);
void hc_expand(Tensor& streams, const Tensor& e);
}  // namespace cpu
namespace cuda {
// The CUDA kernels take up to kHcMaxStreams streams.
inline constexpr int kHcMaxStreams = 16;
void hc_mix(Tensor& input, Tensor& post, Tensor& comb, const Tensor& streams, const Tensor& fn,
            const Tensor& base, const Tensor& scale, const HcArgs& a, const HcCarry& carry);
void hc_collapse(Tensor& out, const Tensor& streams, const Tensor& by);
void hc_write_back(Tensor& streams, const Tensor& y, const Tensor& post, const Tensor& comb);
void hc_head(Tensor& out, const Tensor& streams, const Tensor& fn, const Tensor& base,
             const Tensor& scale, const HcArgs& a);
void hc_expand(Tensor& streams, const Tensor& e);
}  // namespace cuda

inline void hc_mix(Tensor& input, Tensor& post, Tensor& comb, const Tensor& streams,
                   const Tensor& fn, const Tensor& base, const Tensor& scale, const HcArgs& a,
                   const HcCarry& carry = {}) {
  check_same_device("hc_mix", input.device(),
                    {&post, &comb, &streams, &fn, &base, &scale, carry.by, carry.pre_out});
  if (input.device().is_cpu())
    return cpu::hc_mix(input, post, comb, streams, fn, base, scale, a, carry);
  ATOM_KERNEL_CUDA("hc_mix", cuda::hc_mix(input, post, comb, streams, fn, base, scale, a, carry));
}
inline void hc_collapse(Tensor& out, const Tensor& streams, const Tensor& by) {
  check_same_device("hc_collapse", out.device(), {&streams, &by});
  if (out.device().is_cpu()) return cpu::hc_collapse(out, streams, by);
  ATOM_KERNEL_CUDA("hc_collapse", cuda::hc_collapse(out, streams, by));
}
inline void hc_write_back(Tensor& streams, const Tensor& y, const Tensor& post,
                          const Tensor& comb) {
  check_same_device("hc_write_back", streams.device(), {&y, &post, &comb});
  if (streams.device().is_cpu()) return cpu::hc_write_back(streams, y, post, comb);
  ATOM_KERNEL_CUDA("hc_write_back", cuda::hc_write_back(streams, y, post, comb));
}
inline void hc_head(Tensor& out, const Tensor& streams, const Tensor& fn, const Tensor& base,
                    const Tensor& scale, const HcArgs& a) {
  check_same_device("hc_head", out.device(), {&streams, &fn, &base, &scale});
  if (out.device().is_cpu()) return cpu::hc_head(out, streams, fn, base, scale, a);
  ATOM_KERNEL_CUDA("hc_head", cuda::hc_head(out, streams, fn, base, scale, a));
}
inline void hc_expand(Tensor& streams, const Tensor& e) {
  check_same_device("hc_expand", streams.device(), {&e});
  if (streams.device().is_cpu()) return cpu::hc_expand(streams, e);
  ATOM_KERNEL_CUDA("hc_expand", cuda::hc_expand(streams, e));
}

}  // namespace atom::kernels
