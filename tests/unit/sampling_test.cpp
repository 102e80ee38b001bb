// The CPU reference of seeded sampling (kernels/sampling.h): greedy, filters, and the property
// the engine relies on: a row's token depends only on its logits and (seed, step).
#include "kernels/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "kernels/random.h"

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
