// Seeded random fills (dummy weights, test inputs) through the counter-based generator of
// kernels/rng.h: the same seed gives the same values on the CPU and on the GPU.
#pragma once

#include "kernels/dispatch.h"
#include "kernels/rng.h"

namespace atom::kernels {

// t[i] = lo + (hi - lo) * random_uniform(seed, i) over the flat elements of contiguous `t`
// (F32, BF16 or F16), product and sum each rounded to fp32, then rounded to t's dtype.
namespace cpu {
void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi);
}
namespace cuda {
void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi);
}

inline void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi) {
  if (t.device().is_cpu()) return cpu::fill_uniform(t, seed, lo, hi);
  ATOM_KERNEL_CUDA("fill_uniform", cuda::fill_uniform(t, seed, lo, hi));
}

}  // namespace atom::kernels
