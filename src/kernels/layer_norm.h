#pragma once

#include "kernels/dispatch.h"

namespace atom::kernels {

// out = (x - mean(x)) / sqrt(var(x) + eps) * w + b over the last dimension, in fp32 with the
// biased variance (torch.nn.LayerNorm; the sparse-attention indexer's k_norm).
//   out, x [rows, dim] (rows may be strided; may alias)    w [dim], b [dim] or undefined
namespace cpu {
void layer_norm(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, float eps);
}
namespace cuda {
void layer_norm(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, float eps);
}

inline void layer_norm(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  check_same_device("layer_norm", out.device(), {&x, &w, &b});
  if (out.device().is_cpu()) return cpu::layer_norm(out, x, w, b, eps);
  ATOM_KERNEL_CUDA("layer_norm", cuda::layer_norm(out, x, w, b, eps));
}

}  // namespace atom::kernels
