// Seeded random fills (dummy weights, test inputs) through the counter-based generator of
// kernels/rng.h: the same seed gives the same values on the CPU and on the GPU.
#pragma once

#include "kernels/dispatch.h"
#include "kernels/rng.h"

namespace atom::kernels {

// t[i] = lo + (hi - lo) * random_uniform(seed, i) over the flat elements of contiguous `t`
// (F32, BF16, F16 or F8E4M3), product and sum each rounded to fp32, then rounded to t's dtype
// (e4m3: f32_to_f8e4m3, on both devices).
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

// Bytes: t[i] = lo + floor((hi - lo + 1) * random_uniform(seed, i)), capped at hi, over contiguous
// U8 `t` (0 <= lo <= hi <= 255).
namespace cpu {
void fill_uniform_bytes(Tensor& t, uint64_t seed, int lo, int hi);
}
namespace cuda {
void fill_uniform_bytes(Tensor& t, uint64_t seed, int lo, int hi);
}

inline void fill_uniform_bytes(Tensor& t, uint64_t seed, int lo, int hi) {
  ATOM_CHECK(t.dtype() == DType::kU8 && t.is_contiguous() && 0 <= lo && lo <= hi && hi <= 255,
             "fill_uniform_bytes: {} in [{}, {}] (contiguous U8, 0 <= lo <= hi <= 255)", t.str(),
             lo, hi);
  if (t.device().is_cpu()) return cpu::fill_uniform_bytes(t, seed, lo, hi);
  ATOM_KERNEL_CUDA("fill_uniform_bytes", cuda::fill_uniform_bytes(t, seed, lo, hi));
}

}  // namespace atom::kernels
