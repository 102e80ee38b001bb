// Attention residuals (Kimi-K3's attn_res_block_size; Moonshot's "AttnRes"): the residual stream
// is a bank of block sums, and each sublayer reads a softmax-weighted mix of them.
//   blocks [T, B, D] F32 contiguous: rows [0, n) of each token, the completed blocks and the
//   running sum of the current one (the last), all fp32
//   w [D] F32: the mix site's score vector, its norm's weight times its projection's
//   score_j = Σ_c v_j[c] · rsqrt(mean(v_j²) + eps) · w[c],  p = softmax_j(score)
//   out [T, D] (any float dtype; rows may be strided) = Σ_j p_j v_j     (the raw rows, fp32)
// With one row the mix is that row exactly.
#pragma once

#include "kernels/dispatch.h"

namespace atom::kernels {

// The CUDA kernel keeps up to this many rows' scores.
constexpr int kAttnResMaxRows = 64;

inline void attn_res_check(const Tensor& out, const Tensor& blocks, int64_t n, const Tensor& w) {
  ATOM_CHECK(blocks.dtype() == DType::kF32 && blocks.is_contiguous() && blocks.dim() == 3,
             "attn_res: blocks {} must be contiguous F32 [T, B, D]", blocks.str());
  const int64_t T = blocks.size(0), B = blocks.size(1), D = blocks.size(2);
  ATOM_CHECK(n >= 1 && n <= B && n <= kAttnResMaxRows,
             "attn_res: {} rows of blocks {} (1 to min(B, {}))", n, blocks.str(), kAttnResMaxRows);
  ATOM_CHECK(w.dtype() == DType::kF32 && w.is_contiguous() && w.numel() == D,
             "attn_res: score vector {} for width {}", w.str(), D);
  ATOM_CHECK(
      out.dim() == 2 && out.size(0) == T && out.size(1) == D && (D <= 1 || out.stride(1) == 1),
      "attn_res: out {} for blocks {}: expected [T, D] with contiguous rows", out.str(),
      blocks.str());
}

namespace cpu {
void attn_res(Tensor& out, const Tensor& blocks, int64_t n, const Tensor& w, float eps);
}
namespace cuda {
void attn_res(Tensor& out, const Tensor& blocks, int64_t n, const Tensor& w, float eps);
}

inline void attn_res(Tensor& out, const Tensor& blocks, int64_t n, const Tensor& w, float eps) {
  check_same_device("attn_res", out.device(), {&blocks, &w});
  attn_res_check(out, blocks, n, w);
  if (out.device().is_cpu()) return cpu::attn_res(out, blocks, n, w, eps);
  ATOM_KERNEL_CUDA("attn_res", cuda::attn_res(out, blocks, n, w, eps));
}

}  // namespace atom::kernels
