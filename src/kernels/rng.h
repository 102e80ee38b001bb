// Counter-based random numbers: value i of stream `seed` is a pure function of (seed, i), so any
// device, thread count or batch order produces the same numbers. Used for dummy weights and for
// sampling (docs/cuda.md, "Seeded sampling"). Host and device code; no other atom includes.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ATOM_RNG_HD __host__ __device__ inline
#else
#define ATOM_RNG_HD inline
#endif

namespace atom::kernels {

// splitmix64's finaliser: a bijection of 64-bit words with full avalanche.
ATOM_RNG_HD uint64_t random_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1) from random bits: (the top 23 bits + 0.5) / 2^23, exactly representable, so
// never 0 or 1. (With 24 bits, 2^24 - 1 + 0.5 rounds to 2^24 in float and gives exactly 1, which
// the sampler's Gumbel noise turns into +inf.)
ATOM_RNG_HD float random_uniform_from_bits(uint64_t r) {
  return (static_cast<float>(r >> 41) + 0.5f) * (1.0f / 8388608.0f);
}

// Value i of stream `seed`, uniform in (0, 1).
ATOM_RNG_HD float random_uniform(uint64_t seed, uint64_t i) {
  return random_uniform_from_bits(random_mix(seed ^ random_mix(i)));
}

}  // namespace atom::kernels
