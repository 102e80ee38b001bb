#pragma once

#include "kernels/dispatch.h"

namespace atom::kernels {

// out = a + b (same shapes; rows may be strided).
// add_gated: out = a + sigmoid(gate[r]) * b, gate [R, 1] (a per-row gate logit: Qwen3-Next's
// shared_expert_gate), computed in fp32.
namespace cpu {
void add(Tensor& out, const Tensor& a, const Tensor& b);
void add_gated(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& gate);
// out[r] = x[indices[r]]   out [R, H], x [T, H], indices [R] I32
void gather_rows(Tensor& out, const Tensor& x, const Tensor& indices);
// out = x converted to out's dtype (same shape).
void cast(Tensor& out, const Tensor& x);
// out[r, :] += bias
void add_bias(Tensor& out, const Tensor& bias);
}  // namespace cpu
namespace cuda {
void add(Tensor& out, const Tensor& a, const Tensor& b);
void add_gated(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& gate);
void gather_rows(Tensor& out, const Tensor& x, const Tensor& indices);
void cast(Tensor& out, const Tensor& x);
void add_bias(Tensor& out, const Tensor& bias);
}  // namespace cuda

inline void add(Tensor& out, const Tensor& a, const Tensor& b) {
  check_same_device("add", out.device(), {&a, &b});
  if (out.device().is_cpu()) return cpu::add(out, a, b);
  ATOM_KERNEL_CUDA("add", cuda::add(out, a, b));
}
inline void add_gated(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& gate) {
  check_same_device("add_gated", out.device(), {&a, &b, &gate});
  if (out.device().is_cpu()) return cpu::add_gated(out, a, b, gate);
  ATOM_KERNEL_CUDA("add_gated", cuda::add_gated(out, a, b, gate));
}
inline void gather_rows(Tensor& out, const Tensor& x, const Tensor& indices) {
  check_same_device("gather_rows", out.device(), {&x, &indices});
  if (out.device().is_cpu()) return cpu::gather_rows(out, x, indices);
  ATOM_KERNEL_CUDA("gather_rows", cuda::gather_rows(out, x, indices));
}
inline void cast(Tensor& out, const Tensor& x) {
  check_same_device("cast", out.device(), {&x});
  if (out.device().is_cpu()) return cpu::cast(out, x);
  ATOM_KERNEL_CUDA("cast", cuda::cast(out, x));
}
inline void add_bias(Tensor& out, const Tensor& bias) {
  check_same_device("add_bias", out.device(), {&bias});
  if (out.device().is_cpu()) return cpu::add_bias(out, bias);
  ATOM_KERNEL_CUDA("add_bias", cuda::add_bias(out, bias));
}

}  // namespace atom::kernels
