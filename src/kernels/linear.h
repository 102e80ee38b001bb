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

}  // namespace atom::kernels
