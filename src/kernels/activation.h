#pragma once

#include "kernels/dispatch.h"

namespace atom::kernels {

// out = silu(x[:, :I]) * x[:, I:]
//   out [M, I]    x [M, 2I]
namespace cpu {
void silu_mul(Tensor& out, const Tensor& x);
}
namespace cuda {
void silu_mul(Tensor& out, const Tensor& x);
}

inline void silu_mul(Tensor& out, const Tensor& x) {
  check_same_device("silu_mul", out.device(), {&x});
  if (out.device().is_cpu()) return cpu::silu_mul(out, x);
  ATOM_KERNEL_CUDA("silu_mul", cuda::silu_mul(out, x));
}

}  // namespace atom::kernels
