#pragma once

#include "kernels/dispatch.h"

namespace atom::kernels {

enum class RmsNormKind : int {
  kLlama = 0,   // w * cast(x * rsqrt(mean(x²) + eps))
  kGemma = 1,   // cast(x * rsqrt(mean(x²) + eps) * (1 + w)): weights stored centred on zero
  kGptOss = 2,  // cast(w * x * rsqrt(mean(x²) + eps)): the weight applied before the cast
};

// out = rmsnorm(x) over the last dimension.
//   out, x [rows, dim] (rows may be strided; may alias)    w [dim]
// With `residual` defined: residual = residual + x first, and out = rmsnorm(residual).
namespace cpu {
void rms_norm(Tensor& out, const Tensor& x, Tensor* residual, const Tensor& w, float eps,
              RmsNormKind kind);
}
namespace cuda {
void rms_norm(Tensor& out, const Tensor& x, Tensor* residual, const Tensor& w, float eps,
              RmsNormKind kind);
}

inline void rms_norm(Tensor& out, const Tensor& x, Tensor* residual, const Tensor& w, float eps,
                     RmsNormKind kind = RmsNormKind::kLlama) {
  check_same_device("rms_norm", out.device(), {&x, residual, &w});
  if (out.device().is_cpu()) return cpu::rms_norm(out, x, residual, w, eps, kind);
  ATOM_KERNEL_CUDA("rms_norm", cuda::rms_norm(out, x, residual, w, eps, kind));
}

}  // namespace atom::kernels
