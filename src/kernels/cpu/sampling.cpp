#include "kernels/sampling.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/access.h"
#include "kernels/sampling_scheme.h"

namespace atom::kernels {

Tensor sampling_rows_tensor(const std::vector<SamplingRow>& rows) {
  Tensor t = Tensor::empty({static_cast<int64_t>(rows.size()), static_cast<int64_t>(sizeof(SamplingRow))},
                           DType::kU8);
  if (!rows.empty()) std::memcpy(t.data(), rows.data(), rows.size() * sizeof(SamplingRow));
  return t;
}

namespace cpu {

namespace {
int32_t row_argmax(const char* p, DType dt, int64_t V) {
  int64_t best = 0;
  float bv = load(p, dt, 0);
  for (int64_t v = 1; v < V; ++v) {
    const float x = load(p, dt, v);
    if (x > bv) {
      bv = x;
      best = v;
    }
  }
  return static_cast<int32_t>(best);
}
}  // namespace

void argmax(Tensor& ids, const Tensor& logits) {
  check_rows("argmax", logits, "logits");
  ATOM_CHECK(ids.numel() == logits.size(0) && ids.dtype() == DType::kI32, "argmax: ids {} logits {}",
             ids.str(), logits.str());
  for (int64_t r = 0; r < logits.size(0); ++r)
    ids.ptr<int32_t>()[r] = row_argmax(row_ptr(logits, r), logits.dtype(), logits.size(1));
}

void sample(Tensor& ids, const Tensor& logits, const Tensor& rows) {
  check_rows("sample", logits, "logits");
  const int64_t R = logits.size(0), V = logits.size(1);
  ATOM_CHECK(ids.numel() == R && ids.dtype() == DType::kI32 && logits.dtype() == DType::kF32,
             "sample: ids {} logits {}", ids.str(), logits.str());
  ATOM_CHECK(rows.is_contiguous() && rows.nbytes() == static_cast<uint64_t>(R) * sizeof(SamplingRow),
             "sample: rows {} for {} logits rows", rows.str(), R);
  const auto* params = static_cast<const SamplingRow*>(rows.data());
  std::vector<float> l(static_cast<size_t>(V));
  std::vector<uint32_t> key(static_cast<size_t>(V));
  for (int64_t r = 0; r < R; ++r) {
    const SamplingRow& p = params[r];
    const float* x = reinterpret_cast<const float*>(row_ptr(logits, r));
    if (!(p.temperature >= kGreedyTemperature)) {
      ids.ptr<int32_t>()[r] = row_argmax(row_ptr(logits, r), DType::kF32, V);
      continue;
    }
    float lmax = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < V; ++i) {
      l[i] = std::isnan(x[i]) ? -std::numeric_limits<float>::infinity() : x[i] / p.temperature;
      key[i] = sampling_key(l[i]);
      lmax = std::max(lmax, l[i]);
    }
    uint32_t kmin = 0;
    if (p.min_p > 0.0f) kmin = std::max(kmin, sampling_key(lmax + std::log(p.min_p)));
    if (p.top_k > 0 && p.top_k < V) {
      uint32_t k = 0;
      for (int bit = 31; bit >= 0; --bit) {
        const uint32_t c = k | (1u << bit);
        int64_t n = 0;
        for (int64_t i = 0; i < V; ++i) n += key[i] >= c;
        if (n >= p.top_k) k = c;
      }
      kmin = std::max(kmin, k);
    }
    if (p.top_p < 1.0f) {
      auto mass = [&](uint32_t c) {
        double m = 0;
        for (int64_t i = 0; i < V; ++i)
          if (key[i] >= c) m += static_cast<double>(std::exp(l[i] - lmax));
        return m;
      };
      const double target = static_cast<double>(p.top_p) * mass(kmin);
      uint32_t k = 0;
      for (int bit = 31; bit >= 0; --bit) {
        const uint32_t c = k | (1u << bit);
        if (mass(std::max(c, kmin)) >= target) k = c;
      }
      kmin = std::max(kmin, k);
    }
    const uint64_t stream = sampling_stream(p.seed, p.step);
    int64_t best = -1;
    float bs = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < V; ++i) {
      if (key[i] < kmin) continue;
      const float u = random_uniform(stream, static_cast<uint64_t>(i));
      const float s = l[i] + -std::log(-std::log(u));
      if (s > bs) {
        bs = s;
        best = i;
      }
    }
    ids.ptr<int32_t>()[r] = best >= 0 ? static_cast<int32_t>(best) : row_argmax(row_ptr(logits, r), DType::kF32, V);
  }
}

}  // namespace cpu
}  // namespace atom::kernels
