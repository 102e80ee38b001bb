#pragma once

#include "kernels/dispatch.h"

namespace atom::kernels {

// Rotary embedding, in place, on the first `rot_dim` channels of each head of q and k.
//   q [T, Hq * head_dim], k [T, Hk * head_dim]  (rows may be strided)
//   positions [T] I32
//   inv_freq  [rot_dim / 2] F32     angle = float(pos) * inv_freq[i], computed in fp32
//   scale: multiplies cos and sin (YaRN's attention factor)
//   interleaved: rotate pairs (2i, 2i+1) (GPT-J) instead of halves (i, i + rot_dim/2) (NeoX)
struct RopeArgs {
  int head_dim = 0;
  int rot_dim = 0;
  float scale = 1.0f;
  bool interleaved = false;
};

namespace cpu {
void rope(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq, const RopeArgs& a);
}
namespace cuda {
void rope(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq, const RopeArgs& a);
}

inline void rope(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq,
                 const RopeArgs& a) {
  check_same_device("rope", q.device(), {&k, &positions, &inv_freq});
  if (q.device().is_cpu()) return cpu::rope(q, k, positions, inv_freq, a);
  ATOM_KERNEL_CUDA("rope", cuda::rope(q, k, positions, inv_freq, a));
}

}  // namespace atom::kernels
