// The CPU reference of seeded sampling (kernels/sampling.h): greedy, filters, the property the
// engine relies on (a row's token depends only on its logits and (seed, step)), and the fast host
// implementation against a plain transcription of the scheme in docs/cuda.md.
#include "kernels/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "kernels/random.h"
#include "kernels/sampling_scheme.h"

namespace atom {
namespace {

Tensor random_logits(int64_t rows, int64_t vocab, uint64_t seed) {
  Tensor t = Tensor::empty({rows, vocab}, DType::kF32);
  kernels::fill_uniform(t, seed, -5.0f, 5.0f);
  return t;
}

std::vector<int32_t> sample(const Tensor& logits, const std::vector<kernels::SamplingRow>& rows) {
  Tensor ids = Tensor::empty({logits.size(0)}, DType::kI32);
  kernels::sample(ids, logits, kernels::sampling_rows_tensor(rows));
  return std::vector<int32_t>(ids.ptr<int32_t>(), ids.ptr<int32_t>() + ids.numel());
}

TEST(Sampling, UniformIsInOpenUnitInterval) {
  for (uint64_t i = 0; i < 100000; ++i) {
    const float u = kernels::random_uniform(7, i);
    ASSERT_GT(u, 0.0f);
    ASSERT_LT(u, 1.0f);
  }
  // The extremes of the bits: a 24-bit version rounded the top value up to exactly 1.
  EXPECT_GT(kernels::random_uniform_from_bits(0), 0.0f);
  EXPECT_LT(kernels::random_uniform_from_bits(~0ull), 1.0f);
  const float top = kernels::random_uniform_from_bits(~0ull);
  EXPECT_LT(-std::log(-std::log(top)), kernels::kGumbelBound);
  EXPECT_TRUE(std::isfinite(-std::log(-std::log(kernels::random_uniform_from_bits(0)))));
}

TEST(Sampling, ANegligibleTokenIsNeverDrawn) {
  // One token holds all but ~1e-8 of the mass over a Llama-sized vocabulary. A uniform that can
  // reach 1 gives some token infinite Gumbel noise in 1 of 2^24 draws, i.e. a uniformly random
  // token in ~0.8% of rows here (8 expected in 1000). The likely token is the last one, so that
  // the host sampler cannot skip the others' noise before it has seen it.
  const int64_t V = 131072, hot = V - 1;
  Tensor l = Tensor::empty({1, V}, DType::kF32);
  std::fill(l.ptr<float>(), l.ptr<float>() + V, -30.0f);
  l.ptr<float>()[hot] = 0.0f;
  int other = 0;
  for (uint64_t step = 0; step < 1000; ++step) {
    kernels::SamplingRow r;
    r.temperature = 1.0f;
    r.seed = 3;
    r.step = step;
    other += sample(l, {r})[0] != hot;
  }
  EXPECT_EQ(other, 0);
}

// docs/cuda.md's scheme transcribed literally: 32-step bitwise searches over every token,
// masses recomputed from scratch, Gumbel noise for every kept token.
int32_t scheme_reference(const float* x, int64_t V, const kernels::SamplingRow& p) {
  using kernels::sampling_key;
  auto argmax = [&] {
    int64_t b = 0;
    for (int64_t i = 1; i < V; ++i)
      if (x[i] > x[b]) b = i;
    return static_cast<int32_t>(b);
  };
  if (!(p.temperature >= kernels::kGreedyTemperature)) return argmax();
  std::vector<float> l(static_cast<size_t>(V));
  float lmax = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < V; ++i) {
    l[i] = std::isnan(x[i]) ? -std::numeric_limits<float>::infinity() : x[i] / p.temperature;
    lmax = std::max(lmax, l[i]);
  }
  uint32_t kmin = 0;
  if (p.min_p > 0) kmin = std::max(kmin, sampling_key(lmax + std::log(p.min_p)));
  if (p.top_k > 0 && p.top_k < V) {
    uint32_t k = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t c = k | (1u << bit);
      int64_t n = 0;
      for (int64_t i = 0; i < V; ++i) n += sampling_key(l[i]) >= c;
      if (n >= p.top_k) k = c;
    }
    kmin = std::max(kmin, k);
  }
  if (p.top_p < 1) {
    auto mass = [&](uint32_t c) {
      double m = 0;
      for (int64_t i = 0; i < V; ++i)
        if (sampling_key(l[i]) >= c) m += static_cast<double>(std::exp(l[i] - lmax));
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
  const uint64_t stream = kernels::sampling_stream(p.seed, p.step);
  int64_t best = -1;
  float bs = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < V; ++i) {
    if (sampling_key(l[i]) < kmin) continue;
    const float u = kernels::random_uniform(stream, static_cast<uint64_t>(i));
    const float s = l[i] + -std::log(-std::log(u));
    if (s > bs) {
      bs = s;
      best = i;
    }
  }
  return best >= 0 ? static_cast<int32_t>(best) : argmax();
}

TEST(Sampling, HostRowSamplerIsTheSchemeExactly) {
  std::mt19937 rng(17);
  std::normal_distribution<float> n(0, 3);
  kernels::cpu::SampleScratch scratch;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t V = 1 + static_cast<int64_t>(rng() % 700);
    std::vector<float> x(static_cast<size_t>(V));
    for (auto& v : x) v = n(rng);
    // Ties (top-k and top-p boundaries), masked tokens and a NaN now and then.
    for (int64_t i = 0; i + 1 < V; i += 5) x[i + 1] = x[i];
    if (trial % 4 == 1)
      for (int64_t i = 0; i < V; i += 3) x[i] = -std::numeric_limits<float>::infinity();
    if (trial % 7 == 3) x[static_cast<size_t>(V / 2)] = std::nanf("");
    kernels::SamplingRow p;
    p.temperature = trial % 10 == 0 ? 0.0f : 0.2f + 0.1f * static_cast<float>(trial % 15);
    p.top_k = trial % 3 == 0 ? 0 : static_cast<int32_t>(1 + rng() % 60);
    p.top_p = trial % 4 == 2 ? 1.0f : 0.05f + 0.9f * static_cast<float>(rng() % 100) / 100.0f;
    p.min_p = trial % 5 == 1 ? 0.1f : 0.0f;
    p.seed = rng();
    p.step = static_cast<uint64_t>(trial);
    EXPECT_EQ(kernels::cpu::sample_row(x.data(), V, p, scratch), scheme_reference(x.data(), V, p))
        << "trial " << trial << " V " << V;
  }
}

TEST(Sampling, GreedyAndTopOneAreArgmax) {
  Tensor l = random_logits(6, 300, 1);
  l.ptr<float>()[2 * 300 + 17] = 50.0f;
  l.ptr<float>()[2 * 300 + 200] = 50.0f;  // tie: the first index wins
  Tensor ids = Tensor::empty({6}, DType::kI32);
  kernels::argmax(ids, l);
  std::vector<int32_t> want(ids.ptr<int32_t>(), ids.ptr<int32_t>() + 6);
  EXPECT_EQ(want[2], 17);
  std::vector<kernels::SamplingRow> greedy(6), topk1(6);
  for (auto& r : topk1) {
    r.temperature = 1.5f;
    r.top_k = 1;
    r.seed = 9;
  }
  EXPECT_EQ(sample(l, greedy), want);
  EXPECT_EQ(sample(l, topk1), want);
}

TEST(Sampling, RowsAreIndependentOfTheBatch) {
  Tensor l = random_logits(8, 1000, 2);
  std::vector<kernels::SamplingRow> rows(8);
  for (int r = 0; r < 8; ++r) {
    rows[r].temperature = 0.9f;
    rows[r].top_p = 0.8f;
    rows[r].seed = 100 + r;
    rows[r].step = 5;
  }
  const auto all = sample(l, rows);
  for (int r = 0; r < 8; ++r) {
    Tensor one = l.narrow(0, r, 1).contiguous();
    EXPECT_EQ(sample(one, {rows[r]})[0], all[r]) << r;
  }
  // Another step draws anew; the same (seed, step) draws the same.
  rows[3].step = 6;
  const auto next = sample(l, rows);
  EXPECT_EQ(next[2], all[2]);
}

TEST(Sampling, FiltersKeepOnlyAllowedTokens) {
  const int64_t V = 500;
  Tensor l = random_logits(1, V, 3);
  const float* x = l.ptr<float>();
  float mx = x[0];
  for (int64_t i = 1; i < V; ++i) mx = std::max(mx, x[i]);
  for (uint64_t step = 0; step < 200; ++step) {
    kernels::SamplingRow r;
    r.temperature = 1.0f;
    r.seed = 1;
    r.step = step;
    r.top_k = 10;
    const int32_t a = sample(l, {r})[0];
    int64_t larger = 0;
    for (int64_t i = 0; i < V; ++i) larger += x[i] > x[a];
    EXPECT_LT(larger, 10);
    r.top_k = 0;
    r.min_p = 0.5f;
    const int32_t b = sample(l, {r})[0];
    EXPECT_GE(x[b], mx + std::log(0.5f) - 1e-5f);
  }
}

TEST(Sampling, FrequenciesFollowTheSoftmax) {
  // Two tokens with logits log(3) and 0: the first should win about 3/4 of the draws.
  Tensor l = Tensor::empty({1, 2}, DType::kF32);
  l.ptr<float>()[0] = std::log(3.0f);
  l.ptr<float>()[1] = 0.0f;
  int first = 0;
  const int n = 4000;
  for (int s = 0; s < n; ++s) {
    kernels::SamplingRow r;
    r.temperature = 1.0f;
    r.seed = 77;
    r.step = static_cast<uint64_t>(s);
    first += sample(l, {r})[0] == 0;
  }
  EXPECT_NEAR(static_cast<double>(first) / n, 0.75, 0.03);
}

}  // namespace
}  // namespace atom
