#pragma once

#include "kernels/dispatch.h"

namespace atom::kernels {

// Scheduling hints for linear (the values are the same either way).
struct LinearHints {
  // The product follows a latency-bound kernel (decode attention feeding o_proj): the CUDA skinny
  // kernel issues a quarter of its first weight loads before waiting for that kernel instead of
  // all of them, so that fewer of them queue ahead of its memory accesses.
  bool after_latency_bound = false;
};

// out = x · wᵀ (+ bias). Accumulates in fp32.
//   out  [M, N]  (rows may be strided, columns contiguous)
//   x    [M, K]  (rows may be strided)
//   w    [N, K]  contiguous (F32 or BF16 on the CPU)
//   bias [N] or undefined
namespace cpu {
void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias);
}
namespace cuda {
void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
            const LinearHints& hints = {});
}

inline void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias = {},
                   const LinearHints& hints = {}) {
  check_same_device("linear", out.device(), {&x, &w, &bias});
  if (out.device().is_cpu()) return cpu::linear(out, x, w, bias);
  ATOM_KERNEL_CUDA("linear", cuda::linear(out, x, w, bias, hints));
}

// out [M, I] = silu(g) * u where [g | u] = x · wᵀ (+ bias), w [2I, K] = [gate; up], in one kernel
// where one applies (CUDA, decode-sized M on the skinny GEMV): the same values as linear() into
// [M, 2I] then silu_mul(). Returns false, computing nothing, where none applies (the CPU, larger
// M); the caller then runs the two ops.
namespace cuda {
bool linear_silu_mul(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias);
}
inline bool linear_silu_mul(Tensor& out, const Tensor& x, const Tensor& w,
                            const Tensor& bias = {}) {
  check_same_device("linear_silu_mul", out.device(), {&x, &w, &bias});
  if (out.device().is_cpu()) return false;
#ifdef ATOM_HAVE_CUDA
  return cuda::linear_silu_mul(out, x, w, bias);
#else
  return false;
#endif
}

// out = gelu_tanh(x · wᵀ + bias) (kernels/encoder.h's gelu, tanh form) in one op where one
// applies (CUDA: cuBLASLt's GELU epilogue, for M above the skinny kernel's and out in x's dtype):
// the same values as linear() then gelu() up to rounding. Returns false, computing nothing,
// where none applies (the CPU, decode-sized M); the caller then runs the two ops.
namespace cuda {
bool linear_gelu(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias);
}
inline bool linear_gelu(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias = {}) {
  check_same_device("linear_gelu", out.device(), {&x, &w, &bias});
  if (out.device().is_cpu()) return false;
#ifdef ATOM_HAVE_CUDA
  return cuda::linear_gelu(out, x, w, bias);
#else
  return false;
#endif
}

// out += x · wᵀ + bias (a residual added in the product: cuBLASLt's beta = 1 on CUDA, for M above
// the skinny kernel's and out in x's dtype): the same values as linear() into a temporary then
// add() up to rounding. Returns false, computing nothing, where none applies (the CPU,
// decode-sized M); the caller then runs the two ops.
namespace cuda {
bool linear_accumulate(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias);
}
inline bool linear_accumulate(Tensor& out, const Tensor& x, const Tensor& w,
                              const Tensor& bias = {}) {
  check_same_device("linear_accumulate", out.device(), {&x, &w, &bias});
  if (out.device().is_cpu()) return false;
#ifdef ATOM_HAVE_CUDA
  return cuda::linear_accumulate(out, x, w, bias);
#else
  return false;
#endif
}

// A [q; k; v] projection followed by RoPE on q and k and the paged cache write of k and v
// (kernels/rope.h: rope_kv_cache_write), for linear_rope_kv.
struct QkvRope {
  int q_heads = 0, kv_heads = 0, head_dim = 0;
  const Tensor* positions = nullptr;  // [M] I32
  const Tensor* inv_freq = nullptr;   // [rot_dim / 2] F32
  float scale = 1.0f;
  int rot_dim = 0;
  bool interleaved = false;
  Tensor* k_cache = nullptr;  // [..., kv_heads, head_dim]
  Tensor* v_cache = nullptr;
  const Tensor* slot_mapping = nullptr;  // [M] I32
};
// out [M, (q_heads + 2 kv_heads) head_dim] = x · wᵀ (+ bias), q and k rotated, k and v in the
// cache: the same values as linear(), rope_kv_cache_write(), in one kernel where one applies
// (CUDA, decode-sized M, half-split rotation of whole heads, a cache of x's dtype). Returns false,
// computing nothing, where none applies.
namespace cuda {
bool linear_rope_kv(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                    const QkvRope& r);
}
inline bool linear_rope_kv(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                           const QkvRope& r) {
  check_same_device("linear_rope_kv", out.device(), {&x, &w, &bias});
  if (out.device().is_cpu()) return false;
#ifdef ATOM_HAVE_CUDA
  return cuda::linear_rope_kv(out, x, w, bias, r);
#else
  return false;
#endif
}

// Per-head products out_h = x_h · w_hᵀ for h < heads (multi-head latent attention's absorbed
// W_UK and W_UV), in one kernel where one applies (CUDA, decode-sized M, BF16/F16, 16-byte
// aligned): the same values as linear() per head. out, x and w are head 0's views (out [M, N],
// x [M, K], w [N, K] with contiguous rows); head h's start `h * *_head_stride` elements further
// (out and x: columns of the same rows; w: its own rows). Returns false, computing nothing,
// where none applies; the caller then runs linear() per head.
namespace cuda {
bool linear_heads(Tensor& out, const Tensor& x, const Tensor& w, int heads, int64_t out_head_stride,
                  int64_t x_head_stride, int64_t w_head_stride);
}
inline bool linear_heads(Tensor& out, const Tensor& x, const Tensor& w, int heads,
                         int64_t out_head_stride, int64_t x_head_stride, int64_t w_head_stride) {
  check_same_device("linear_heads", out.device(), {&x, &w});
  if (out.device().is_cpu()) return false;
#ifdef ATOM_HAVE_CUDA
  return cuda::linear_heads(out, x, w, heads, out_head_stride, x_head_stride, w_head_stride);
#else
  return false;
#endif
}

}  // namespace atom::kernels
