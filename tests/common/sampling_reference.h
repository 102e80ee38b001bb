// An independent derivation of the seeded sampling scheme (docs/cuda.md, "Seeded sampling"),
// written from the document and sharing no code with atom: its own splitmix64, uniforms, Gumbel
// noise and float keys, and filters found by sorting the tokens instead of the 32-pass bitwise
// searches of kernels::cpu::sample_row and the CUDA kernel. Tests compare both samplers (and the
// engine's draws) against it, so a bug in the shared row function cannot pass as agreement of
// two callers of the same code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

namespace atom::test {

struct RefSamplingParams {
  float temperature = 0.0f;  // < 1e-5: greedy
  float top_p = 1.0f;
  float min_p = 0.0f;
  int32_t top_k = 0;
  uint64_t seed = 0;
  uint64_t step = 0;  // index of the output token being drawn
};

// splitmix64's finaliser, as docs/cuda.md gives it.
inline uint64_t ref_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline uint64_t ref_stream(uint64_t seed, uint64_t step) {
  return ref_mix(seed ^ ref_mix(step ^ 0x5a6d706c65ull));
}
// ((bits >> 41) + 0.5) / 2^23: 23 bits, exact in float, in (0, 1).
inline float ref_uniform(uint64_t stream, uint64_t i) {
  const uint64_t r = ref_mix(stream ^ ref_mix(i));
  return (static_cast<float>(r >> 41) + 0.5f) / 8388608.0f;
}
inline float ref_gumbel(uint64_t stream, uint64_t i) {
  return -std::log(-std::log(ref_uniform(stream, i)));
}
// The order-preserving integer image of a float (no NaN): thresholds compare these.
inline uint32_t ref_key(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The set of tokens the filters keep, as flags (empty for a greedy row).
inline std::vector<bool> reference_kept(const float* x, int64_t V, const RefSamplingParams& p) {
  const float inf = std::numeric_limits<float>::infinity();
  const size_t n = static_cast<size_t>(V);
  std::vector<float> l(n);
  for (size_t i = 0; i < n; ++i) l[i] = std::isnan(x[i]) ? -inf : x[i] / p.temperature;
  const float lmax = *std::max_element(l.begin(), l.end());
  std::vector<uint32_t> key(n);
  for (size_t i = 0; i < n; ++i) key[i] = ref_key(l[i]);
  // Tokens by key, largest first (ties in id order).
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key[a] > key[b]; });
  uint32_t kmin = 0;
  // top-k: the k-th largest key (ties with it kept).
  if (p.top_k > 0 && p.top_k < V)
    kmin = std::max(kmin, key[order[static_cast<size_t>(p.top_k) - 1]]);
  // min-p: l >= max(l) + log(min_p).
  if (p.min_p > 0) kmin = std::max(kmin, ref_key(lmax + std::log(p.min_p)));
  std::vector<bool> keep(n);
  for (size_t i = 0; i < n; ++i) keep[i] = key[i] >= kmin;
  if (p.top_p < 1) {
    // The smallest set of largest l whose mass reaches top_p of the kept mass: walk the kept
    // tokens from the largest, the first one whose running mass reaches the target is the last
    // one in (the token that crosses the threshold), together with every token tied with it.
    std::vector<float> e(n);
    double total = 0;
    for (size_t i = 0; i < n; ++i)
      if (keep[i]) total += static_cast<double>(e[i] = std::exp(l[i] - lmax));
    const double target = static_cast<double>(p.top_p) * total;
    double run = 0;
    uint32_t crossing = kmin;
    for (size_t j = 0; j < n; ++j) {
      const size_t i = order[j];
      if (!keep[i]) continue;
      run += static_cast<double>(e[i]);
      // A key's mass includes every token tied with it: decide after its last one.
      if (j + 1 < n && key[order[j + 1]] == key[i]) continue;
      if (run >= target) {
        crossing = key[i];
        break;
      }
    }
    for (size_t i = 0; i < n; ++i) keep[i] = keep[i] && key[i] >= crossing;
  }
  return keep;
}

// The token the scheme draws from logits x[0, V).
inline int32_t reference_sample(const float* x, int64_t V, const RefSamplingParams& p) {
  auto argmax = [&] {
    int64_t b = 0;
    for (int64_t i = 1; i < V; ++i)
      if (x[i] > x[b]) b = i;  // first index on ties; NaN never wins
    return static_cast<int32_t>(b);
  };
  if (!(p.temperature >= 1e-5f)) return argmax();
  const std::vector<bool> keep = reference_kept(x, V, p);
  const uint64_t stream = ref_stream(p.seed, p.step);
  int64_t best = -1;
  float bs = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < V; ++i) {
    if (!keep[static_cast<size_t>(i)]) continue;
    const float l =
        std::isnan(x[i]) ? -std::numeric_limits<float>::infinity() : x[i] / p.temperature;
    const float s = l + ref_gumbel(stream, static_cast<uint64_t>(i));
    if (s > bs) {
      bs = s;
      best = i;
    }
  }
  return best >= 0 ? static_cast<int32_t>(best) : argmax();
}

inline int32_t reference_sample(const std::vector<float>& x, const RefSamplingParams& p) {
  return reference_sample(x.data(), static_cast<int64_t>(x.size()), p);
}

}  // namespace atom::test
