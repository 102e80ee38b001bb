#pragma once

#include "kernels/dispatch.h"

namespace atom::kernels {

// out = silu(g) * u with g = x[:, :I], u = x[:, I:]; limit > 0: the clamped SwiGLU of
// DeepSeek-V4 and GLM-5.3 (swiglu_limit), silu(min(g, limit)) * clamp(u, -limit, limit).
//   out [M, I]    x [M, 2I]
namespace cpu {
void silu_mul(Tensor& out, const Tensor& x, float limit);
}
namespace cuda {
void silu_mul(Tensor& out, const Tensor& x, float limit);
}

inline void silu_mul(Tensor& out, const Tensor& x, float limit = 0.0f) {
  check_same_device("silu_mul", out.device(), {&x});
  if (out.device().is_cpu()) return cpu::silu_mul(out, x, limit);
  ATOM_KERNEL_CUDA("silu_mul", cuda::silu_mul(out, x, limit));
}

}  // namespace atom::kernels
