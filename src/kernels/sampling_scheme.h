// The seeded sampling scheme shared by the CPU reference, the CUDA kernel and the engine's CPU
// sampler: Gumbel-max over the kept tokens, with the Gumbel noise of token i a pure
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

// The Gumbel noise of token i in a stream: -log(-log(u)), u uniform in (0, 1).
ATOM_RNG_HD float sampling_gumbel(uint64_t stream, uint64_t i) {
  return -logf(-logf(random_uniform(stream, i)));
}

// Above every value sampling_gumbel can return (16.64, at the largest u, 1 - 2^-24): a token
// whose scaled logit l has l + kGumbelBound below the best score so far cannot win, so the host
// skips its noise without changing the draw.
constexpr float kGumbelBound = 17.0f;

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
