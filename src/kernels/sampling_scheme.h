// The seeded sampling scheme shared by the CPU reference and the CUDA kernel (and meant for the
// engine's sampler): Gumbel-max over the kept tokens, with the Gumbel noise of token i a pure
// function of (seed, step, i). Thresholds are searched over the order-preserving integer image
// of the floats, so both backends find the same kept set.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/rng.h"

namespace atom::kernels {

// The random stream of one request's step-th token.
ATOM_RNG_HD uint64_t sampling_stream(uint64_t seed, uint64_t step) {
  return random_mix(seed ^ random_mix(step ^ 0x5a6d706c65ull));
}

// Order-preserving map of floats (no NaN) to unsigned integers.
ATOM_RNG_HD uint32_t sampling_key(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

ATOM_RNG_HD float sampling_key_value(uint32_t k) {
  const uint32_t b = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
  float f;
  memcpy(&f, &b, 4);
  return f;
}

}  // namespace atom::kernels
