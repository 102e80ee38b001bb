#include "kernels/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "kernels/cpu/access.h"
#include "kernels/sampling_scheme.h"

namespace atom::kernels {

Tensor sampling_rows_tensor(const std::vector<SamplingRow>& rows) {
  Tensor t = Tensor::empty(
      {static_cast<int64_t>(rows.size()), static_cast<int64_t>(sizeof(SamplingRow))}, DType::kU8);
  if (!rows.empty()) std::memcpy(t.data(), rows.data(), rows.size() * sizeof(SamplingRow));
  return t;
}

namespace cpu {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The first index of the largest value; NaN never wins (a leading NaN gives 0).
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

int32_t argmax_f32(const float* x, int64_t V) {
  int64_t best = 0;
  for (int64_t v = 1; v < V; ++v)
    if (x[v] > x[best]) best = v;
  return static_cast<int32_t>(best);
}

// Keeps the candidates whose key is at least c (id order is preserved).
void keep_at_least(std::vector<int32_t>& cand, const std::vector<uint32_t>& key, uint32_t c) {
  std::erase_if(cand, [&](int32_t i) { return key[static_cast<size_t>(i)] < c; });
}
}  // namespace

void argmax(Tensor& ids, const Tensor& logits) {
  check_rows("argmax", logits, "logits");
  ATOM_CHECK(ids.numel() == logits.size(0) && ids.dtype() == DType::kI32,
             "argmax: ids {} logits {}", ids.str(), logits.str());
  for (int64_t r = 0; r < logits.size(0); ++r)
    ids.ptr<int32_t>()[r] = row_argmax(row_ptr(logits, r), logits.dtype(), logits.size(1));
}

// The scheme of docs/cuda.md ("Seeded sampling"), with the same arithmetic as the CUDA kernel's
// 32-pass searches but less work: the top-k threshold is the k-th largest key (what the bitwise
// search converges to), and the top-p search drops tokens below the bits it has fixed, which
// leaves every mass it compares summed over the same tokens in the same (id) order.
int32_t sample_row(const float* x, int64_t V, const SamplingRow& p, SampleScratch& s) {
  if (!(p.temperature >= kGreedyTemperature)) return argmax_f32(x, V);
  const size_t n = static_cast<size_t>(V);
  s.l.resize(n);
  s.key.resize(n);
  float* l = s.l.data();
  uint32_t* key = s.key.data();
  float lmax = kNegInf;
  for (int64_t i = 0; i < V; ++i) {
    l[i] = std::isnan(x[i]) ? kNegInf : x[i] / p.temperature;
    key[i] = sampling_key(l[i]);
    lmax = std::max(lmax, l[i]);
  }
  uint32_t kmin = 0;
  if (p.min_p > 0.0f) kmin = std::max(kmin, sampling_key(lmax + std::log(p.min_p)));
  if (p.top_k > 0 && p.top_k < V) {
    s.sel.assign(s.key.begin(), s.key.end());
    const auto kth = s.sel.begin() + (p.top_k - 1);
    std::nth_element(s.sel.begin(), kth, s.sel.end(), std::greater<uint32_t>());
    kmin = std::max(kmin, *kth);
  }
  auto& cand = s.cand;
  cand.clear();
  for (int64_t i = 0; i < V; ++i)
    if (key[i] >= kmin) cand.push_back(static_cast<int32_t>(i));
  if (p.top_p < 1.0f) {
    s.e.resize(n);
    float* e = s.e.data();
    double total = 0;
    for (int32_t i : cand) total += static_cast<double>(e[i] = std::exp(l[i] - lmax));
    const double target = static_cast<double>(p.top_p) * total;
    uint32_t k = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t c = std::max(k | (1u << bit), kmin);
      double mass = 0;
      for (int32_t i : cand)
        if (key[i] >= c) mass += static_cast<double>(e[i]);
      if (mass >= target) {
        k |= 1u << bit;
        keep_at_least(cand, s.key, c);
      }
    }
  }
  // Gumbel-max over the kept tokens in id order (the first index wins ties).
  const uint64_t stream = sampling_stream(p.seed, p.step);
  int32_t best = -1;
  float bs = kNegInf;
  for (int32_t i : cand) {
    if (l[i] + kGumbelBound < bs) continue;  // cannot reach the best score
    const float score = l[i] + sampling_gumbel(stream, static_cast<uint64_t>(i));
    if (score > bs) {
      bs = score;
      best = i;
    }
  }
  return best >= 0 ? best : argmax_f32(x, V);
}

void sample(Tensor& ids, const Tensor& logits, const Tensor& rows) {
  check_rows("sample", logits, "logits");
  const int64_t R = logits.size(0), V = logits.size(1);
  ATOM_CHECK(ids.numel() == R && ids.dtype() == DType::kI32 && logits.dtype() == DType::kF32,
             "sample: ids {} logits {}", ids.str(), logits.str());
  ATOM_CHECK(
      rows.is_contiguous() && rows.nbytes() == static_cast<uint64_t>(R) * sizeof(SamplingRow),
      "sample: rows {} for {} logits rows", rows.str(), R);
  const auto* params = static_cast<const SamplingRow*>(rows.data());
  int32_t* out = ids.ptr<int32_t>();
#pragma omp parallel if (R >= 4)
  {
    SampleScratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t r = 0; r < R; ++r)
      out[r] =
          sample_row(reinterpret_cast<const float*>(row_ptr(logits, r)), V, params[r], scratch);
  }
}

void mask_logits(Tensor& logits, const Tensor& masks, const Tensor& index) {
  const int64_t R = logits.size(0), V = logits.size(1), M = masks.size(0), W = masks.size(1);
  const int32_t* idx = index.ptr<int32_t>();
  for (int64_t r = 0; r < R; ++r)
    ATOM_CHECK(idx[r] >= -1 && idx[r] < M, "mask_logits: row {} names mask {} of {}", r, idx[r], M);
  const auto* words = masks.ptr<uint64_t>();
#pragma omp parallel for schedule(static) if (R >= 4)
  for (int64_t r = 0; r < R; ++r) {
    if (idx[r] < 0) continue;
    float* x = reinterpret_cast<float*>(row_ptr(logits, r));
    const uint64_t* m = words + idx[r] * W;
    for (int64_t t = 0; t < V; ++t)
      if (!((m[t / 64] >> (t % 64)) & 1)) x[t] = -std::numeric_limits<float>::infinity();
  }
}

}  // namespace cpu
}  // namespace atom::kernels
