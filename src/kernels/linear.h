#pragma once

#include "kernels/dispatch.h"

namespace atom::kernels {

// out = x · wᵀ (+ bias). Accumulates in fp32.
//   out  [M, N]  (rows may be strided, columns contiguous)
//   x    [M, K]  (rows may be strided)
//   w    [N, K]  contiguous (F32 or BF16 on the CPU)
//   bias [N] or undefined
namespace cpu {
void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias);
}
namespace cuda {
void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias);
}

inline void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias = {}) {
  check_same_device("linear", out.device(), {&x, &w, &bias});
  if (out.device().is_cpu()) return cpu::linear(out, x, w, bias);
  ATOM_KERNEL_CUDA("linear", cuda::linear(out, x, w, bias));
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

}  // namespace atom::kernels
