// The CPU reference of seeded sampling (kernels/sampling.h): greedy, filters, the property the
// engine relies on (a row's token depends only on its logits and (seed, step)), and the fast host
// implementation against an independent derivation of the scheme in docs/cuda.md
// (common/sampling_reference.h: its own random numbers, filters found by sorting).
#include "kernels/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "common/sampling_reference.h"
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

// The scheme derived independently (common/sampling_reference.h) for a kernels::SamplingRow.
int32_t scheme_reference(const float* x, int64_t V, const kernels::SamplingRow& r) {
  test::RefSamplingParams p;
  p.temperature = r.temperature;
  p.top_p = r.top_p;
  p.min_p = r.min_p;
  p.top_k = r.top_k;
  p.seed = r.seed;
  p.step = r.step;
  return test::reference_sample(x, V, p);
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
  const int64_t V = 1000;
  Tensor l = random_logits(8, V, 2);
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
    EXPECT_EQ(all[r], scheme_reference(l.ptr<float>() + r * V, V, rows[r])) << r;
  }
  // A later step of one row draws anew (the token the scheme gives for that step), and the other
  // rows, whose (seed, step) did not change, draw what they drew.
  rows[3].step = 6;
  const auto next = sample(l, rows);
  EXPECT_EQ(next[3], scheme_reference(l.ptr<float>() + 3 * V, V, rows[3]));
  for (int r = 0; r < 8; ++r)
    if (r != 3) {
      EXPECT_EQ(next[r], all[r]) << r;
    }
  // Over 40 steps a row's draws change: this nucleus holds hundreds of tokens, none with more
  // than ~2% of its mass, so a sampler that ignored the step would repeat one token 40 times.
  std::set<int32_t> seen;
  for (uint64_t step = 0; step < 40; ++step) {
    rows[3].step = step;
    const int32_t t = sample(l, rows)[3];
    EXPECT_EQ(t, scheme_reference(l.ptr<float>() + 3 * V, V, rows[3])) << "step " << step;
    seen.insert(t);
  }
  EXPECT_GE(seen.size(), 30u) << "40 steps of one row drew only " << seen.size() << " tokens";
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

// Structured output's mask (kernels::mask_logits), checked token by token against the bit rule:
// a disallowed token becomes -inf, an allowed one keeps its value bit for bit, a row with index
// -1 is untouched, bits past the vocabulary are ignored, and rows may be strided views.
TEST(Sampling, MaskLogitsClearsExactlyTheDisallowedTokens) {
  const int64_t R = 7, V = 1000, W = (V + 63) / 64, M = 3;
  Tensor base = random_logits(R, V + 24, 5);
  Tensor logits = base.narrow(1, 0, V);  // row stride V + 24
  Tensor before = logits.contiguous();
  Tensor masks = Tensor::empty({M, W}, DType::kU64);
  std::mt19937_64 rng(9);
  for (int64_t i = 0; i < M * W; ++i) masks.ptr<uint64_t>()[i] = rng();
  masks.ptr<uint64_t>()[2 * W + W - 1] = ~uint64_t{0};  // bits past V set: ignored
  Tensor index = Tensor::empty({R}, DType::kI32);
  const int32_t pick[R] = {0, -1, 2, 1, 0, -1, 2};
  std::copy(pick, pick + R, index.ptr<int32_t>());
  kernels::mask_logits(logits, masks, index);
  int64_t cleared = 0, kept = 0;
  for (int64_t r = 0; r < R; ++r) {
    const float* x = reinterpret_cast<const float*>(base.ptr<float>() + r * (V + 24));
    const float* x0 = before.ptr<float>() + r * V;
    for (int64_t t = 0; t < V; ++t) {
      const bool allowed =
          pick[r] < 0 || ((masks.ptr<uint64_t>()[pick[r] * W + t / 64] >> (t % 64)) & 1);
      if (allowed) {
        EXPECT_EQ(x[t], x0[t]) << r << "," << t;
        ++kept;
      } else {
        EXPECT_EQ(x[t], -std::numeric_limits<float>::infinity()) << r << "," << t;
        ++cleared;
      }
    }
    for (int64_t t = V; t < V + 24; ++t)  // the view's padding is not written
      EXPECT_NE(x[t], -std::numeric_limits<float>::infinity());
  }
  EXPECT_GT(cleared, 2000);
  EXPECT_GT(kept, 2000);
  // A mask index out of range, or a mask table too narrow, names the problem.
  index.ptr<int32_t>()[3] = M;
  EXPECT_THROW(kernels::mask_logits(logits, masks, index), Error);
  Tensor narrow_masks = Tensor::empty({M, W - 1}, DType::kU64);
  index.ptr<int32_t>()[3] = 0;
  EXPECT_THROW(kernels::mask_logits(logits, narrow_masks, index), Error);
}

}  // namespace
}  // namespace atom
