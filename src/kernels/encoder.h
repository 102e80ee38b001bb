// Ops of bidirectional encoders (the vision towers): attention over variable-length sequences
// without a cache or a causal mask, the rotary embedding of consecutive channel pairs from
// per-row tables (MoonViT's 2D RoPE), GELU, and the mean of gathered rows (the patch merge).
#pragma once

#include <vector>

#include "core/arena.h"
#include "kernels/dispatch.h"

namespace atom::kernels {

// Multi-head attention of every row over all rows of its own sequence (none across sequences),
// softmax in fp32: out_h = softmax(scale · q_h k_hᵀ) v_h per head h.
//   out [T, H * D]    qkv [T, 3 * H * D], each row [q | k | v] (rows may be strided)
//   starts: the sequences' first rows on the host, [S + 1], 0 = starts[0] < ... < starts[S] = T
//   scratch: CUDA's buffers come from it (kGemm's scores at most about 256 MiB at once, longer
//   sequences in chunks of heads and of query rows; kFlash's padded copies); the CPU uses none.
// CUDA's two ways (the CPU has one): kFlash, the paged flash-attention kernels without the causal
// mask, q, k and v copied into heads padded to 64 or 128 (BF16/F16, head_dim <= 128); kGemm, two
// strided-batched cuBLAS GEMMs per sequence around a row softmax, the scores in memory (any dtype
// and head_dim). kAuto: ATOM_ENCODER_ATTENTION=flash|gemm when set, else kFlash where it applies.
// rope_cos / rope_sin ([T, head_dim / 2] F32 contiguous, on qkv's device; null: none): q and k
// are first turned as rotate_pairs() does. qkv's q and k columns may then hold the rotated values
// (the CPU and kGemm rotate them in place; kFlash rotates into its padded copies, in one pass).
enum class EncoderAttentionBackend { kAuto, kFlash, kGemm };
struct EncoderAttention {
  int heads = 0;
  int head_dim = 0;
  float scale = 1.0f;
  EncoderAttentionBackend backend = EncoderAttentionBackend::kAuto;
  const Tensor* rope_cos = nullptr;
  const Tensor* rope_sin = nullptr;
};
namespace cpu {
void encoder_attention(Tensor& out, const Tensor& qkv, const std::vector<int64_t>& starts,
                       const EncoderAttention& a);
}
namespace cuda {
void encoder_attention(Tensor& out, const Tensor& qkv, const std::vector<int64_t>& starts,
                       const EncoderAttention& a, Arena& scratch);
}
inline void rotate_pairs(Tensor& x, const Tensor& cos, const Tensor& sin, int head_dim);
inline void encoder_attention(Tensor& out, const Tensor& qkv, const std::vector<int64_t>& starts,
                              const EncoderAttention& a, Arena& scratch) {
  check_same_device("encoder_attention", out.device(), {&qkv});
  ATOM_CHECK(!a.rope_cos == !a.rope_sin, "encoder_attention: rope_cos and rope_sin go together");
  if (a.rope_cos) check_same_device("encoder_attention", out.device(), {a.rope_cos, a.rope_sin});
  if (out.device().is_cpu()) {
    if (a.rope_cos) {
      Tensor qk = qkv.narrow(1, 0, 2 * static_cast<int64_t>(a.heads) * a.head_dim);
      rotate_pairs(qk, *a.rope_cos, *a.rope_sin, a.head_dim);
    }
    return cpu::encoder_attention(out, qkv, starts, a);
  }
  ATOM_KERNEL_CUDA("encoder_attention", cuda::encoder_attention(out, qkv, starts, a, scratch));
}

// In place, channel pairs (2m, 2m + 1) of every head of row t turned as complex numbers by angle
// m of that row: (x0, x1) -> (x0 c - x1 s, x0 s + x1 c), c = cos[t, m], s = sin[t, m].
//   x [T, n * head_dim] (rows may be strided)    cos, sin [T, head_dim / 2] F32 contiguous
namespace cpu {
void rotate_pairs(Tensor& x, const Tensor& cos, const Tensor& sin, int head_dim);
}
namespace cuda {
void rotate_pairs(Tensor& x, const Tensor& cos, const Tensor& sin, int head_dim);
}
inline void rotate_pairs(Tensor& x, const Tensor& cos, const Tensor& sin, int head_dim) {
  check_same_device("rotate_pairs", x.device(), {&cos, &sin});
  if (x.device().is_cpu()) return cpu::rotate_pairs(x, cos, sin, head_dim);
  ATOM_KERNEL_CUDA("rotate_pairs", cuda::rotate_pairs(x, cos, sin, head_dim));
}

// out = gelu(x) in fp32: tanh_approx, 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))) (gelu_tanh,
// gelu_pytorch_tanh); else 0.5 x (1 + erf(x / √2)).
//   out, x [R, C] (rows may be strided; may alias)
namespace cpu {
void gelu(Tensor& out, const Tensor& x, bool tanh_approx);
}
namespace cuda {
void gelu(Tensor& out, const Tensor& x, bool tanh_approx);
}
inline void gelu(Tensor& out, const Tensor& x, bool tanh_approx) {
  check_same_device("gelu", out.device(), {&x});
  if (out.device().is_cpu()) return cpu::gelu(out, x, tanh_approx);
  ATOM_KERNEL_CUDA("gelu", cuda::gelu(out, x, tanh_approx));
}

// out[r] = (1 / n) Σ_{j < n} x[indices[r · n + j]], in fp32 (n = 1: a gather).
//   out [R, C]    x [T, C] (rows of both may be strided)    indices [R · n] I32, each in [0, T)
namespace cpu {
void gather_mean_rows(Tensor& out, const Tensor& x, const Tensor& indices, int n);
}
namespace cuda {
void gather_mean_rows(Tensor& out, const Tensor& x, const Tensor& indices, int n);
}
inline void gather_mean_rows(Tensor& out, const Tensor& x, const Tensor& indices, int n) {
  check_same_device("gather_mean_rows", out.device(), {&x, &indices});
  if (out.device().is_cpu()) return cpu::gather_mean_rows(out, x, indices, n);
  ATOM_KERNEL_CUDA("gather_mean_rows", cuda::gather_mean_rows(out, x, indices, n));
}

}  // namespace atom::kernels
