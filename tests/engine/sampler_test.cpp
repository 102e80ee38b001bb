// CpuSampler against independent references: argmax, log_softmax in long double, hand-computed
// penalty effects, empirical distributions against the filtered softmax computed here with a
// plain full sort, and kernels::sample on rows modified here by hand (the device path).
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "common/sampling_reference.h"
#include "kernels/sampling.h"

namespace atom {
namespace {

Tensor logits_of(const std::vector<std::vector<float>>& rows) {
  Tensor t = Tensor::empty(
      {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, DType::kF32);
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy(rows[r].begin(), rows[r].end(), t.ptr<float>() + r * rows[0].size());
  return t;
}

int32_t sample_one(CpuSampler& s, const std::vector<float>& logits, const SamplingParams& p,
                   uint64_t seed = 0, int64_t position = 0, std::vector<int32_t> prompt = {},
                   std::vector<int32_t> output = {}, std::vector<int32_t> suppressed = {}) {
  Tensor t = logits_of({logits});
  SampleTask task;
  task.params = &p;
  task.seed = seed;
  task.position = position;
  task.prompt = prompt;
  task.output = output;
  task.suppressed = suppressed;
  std::vector<int32_t> out(1);
  s.sample(t, {&task, 1}, out);
  return out[0];
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

TEST(CpuSampler, GreedyIsArgmaxFirstOnTies) {
  CpuSampler s;
  std::mt19937 rng(3);
  std::normal_distribution<float> n;
  for (int i = 0; i < 20; ++i) {
    std::vector<float> l(777);
    for (auto& x : l) x = n(rng);
    EXPECT_EQ(sample_one(s, l, greedy()),
              static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
  }
  EXPECT_EQ(sample_one(s, {1, 3, 3, 2}, greedy()), 1);
}

TEST(CpuSampler, PenaltiesBiasAndSuppression) {
  CpuSampler s;
  const std::vector<float> l = {2.0f, 1.9f, -1.0f, -1.05f};
  SamplingParams p = greedy();
  p.frequency_penalty = 0.06;  // token 0 seen twice in the output: 2.0 - 0.12 < 1.9
  EXPECT_EQ(sample_one(s, l, p, 0, 0, {}, {0, 0}), 1);
  EXPECT_EQ(sample_one(s, l, p, 0, 0, {}, {0}), 0);  // once: 1.94 > 1.9
  p = greedy();
  p.presence_penalty = 0.2;
  EXPECT_EQ(sample_one(s, l, p, 0, 0, {}, {0}), 1);
  EXPECT_EQ(sample_one(s, l, p, 0, 0, {0}, {}), 0) << "presence counts output tokens only";
  p = greedy();
  p.repetition_penalty = 1.1;  // prompt tokens count too: 2.0 / 1.1 = 1.82 < 1.9
  EXPECT_EQ(sample_one(s, l, p, 0, 0, {0}, {}), 1);
  // Negative logits are multiplied: -1.0 * 1.1 = -1.1 < -1.05.
  EXPECT_EQ(sample_one(s, {-1.0f, -1.05f}, p, 0, 0, {0}, {}), 1);
  p = greedy();
  p.logit_bias = {{3, 3.5f}};
  EXPECT_EQ(sample_one(s, l, p), 3);
  EXPECT_EQ(sample_one(s, l, greedy(), 0, 0, {}, {}, {0, 1}), 2) << "suppressed ids are skipped";
}

// softmax(logits / T) over the tokens min_p, top_k and top_p keep, from a plain full sort.
std::vector<double> expected_distribution(const std::vector<float>& l, const SamplingParams& p) {
  const size_t V = l.size();
  std::vector<double> x(V);
  for (size_t i = 0; i < V; ++i)
    x[i] = static_cast<double>(l[i] / static_cast<float>(p.temperature));
  const double mx = *std::max_element(x.begin(), x.end());
  std::vector<double> e(V);
  for (size_t i = 0; i < V; ++i) e[i] = std::exp(x[i] - mx);
  std::vector<bool> keep(V, true);
  for (size_t i = 0; i < V; ++i)
    if (p.min_p > 0 && e[i] < p.min_p) keep[i] = false;
  std::vector<size_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] > x[b]; });
  if (p.top_k > 0) {
    size_t kept = 0;
    for (size_t i : order)
      if (keep[i] && ++kept > static_cast<size_t>(p.top_k)) keep[i] = false;
  }
  double total = 0;
  for (size_t i = 0; i < V; ++i) total += keep[i] ? e[i] : 0;
  if (p.top_p < 1) {
    double acc = 0;
    for (size_t i : order) {
      if (!keep[i]) continue;
      if (acc >= p.top_p * total)
        keep[i] = false;
      else
        acc += e[i];
    }
    total = acc;
  }
  std::vector<double> prob(V, 0);
  for (size_t i = 0; i < V; ++i) prob[i] = keep[i] ? e[i] / total : 0;
  return prob;
}

// How often each token is drawn in `draws` draws of one row (rows of one row each, a thousand per
// call: positions differ, so the draws are independent).
std::vector<int> draw_counts(const std::vector<float>& l, const SamplingParams& p, int draws) {
  CpuSampler s;
  std::vector<int> count(l.size(), 0);
  for (int first = 0; first < draws; first += 1000) {
    const int n = std::min(1000, draws - first);
    Tensor t = logits_of(std::vector<std::vector<float>>(static_cast<size_t>(n), l));
    std::vector<SampleTask> tasks(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      tasks[i].row = i;
      tasks[i].params = &p;
      tasks[i].seed = 99;
      tasks[i].position = first + i;
    }
    std::vector<int32_t> out(static_cast<size_t>(n));
    s.sample(t, tasks, out);
    for (int32_t tok : out) ++count[static_cast<size_t>(tok)];
  }
  return count;
}

void check_distribution(const std::vector<float>& l, const SamplingParams& p, int draws) {
  const auto want = expected_distribution(l, p);
  const std::vector<int> count = draw_counts(l, p, draws);
  for (size_t i = 0; i < l.size(); ++i) {
    if (want[i] == 0) {
      EXPECT_EQ(count[i], 0) << "token " << i << " is filtered out but was drawn";
      continue;
    }
    const double f = static_cast<double>(count[i]) / draws;
    const double sd = std::sqrt(want[i] * (1 - want[i]) / draws);
    EXPECT_NEAR(f, want[i], 5 * sd + 1e-3) << "token " << i;
  }
}

TEST(CpuSampler, TemperatureDistribution) {
  SamplingParams p;
  p.temperature = 0.7;
  check_distribution({1.0f, 0.5f, 0.0f, -0.5f, 2.0f, 0.2f}, p, 20000);
}

TEST(CpuSampler, TopKTopPMinPDistribution) {
  const std::vector<float> l = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, 0.2f, 1.7f, -3.0f};
  SamplingParams p;
  p.temperature = 1.3;
  p.top_k = 4;
  check_distribution(l, p, 20000);
  p.top_k = 0;
  p.top_p = 0.6;
  check_distribution(l, p, 20000);
  p.top_p = 1.0;
  p.min_p = 0.3;
  check_distribution(l, p, 20000);
  p.top_k = 5;
  p.top_p = 0.8;
  p.min_p = 0.05;
  check_distribution(l, p, 20000);
}

TEST(CpuSampler, TopPOnALargeVocabularyKeepsExactlyTheNucleus) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0, 2);
  std::vector<float> l(5000);
  for (auto& x : l) x = n(rng);
  SamplingParams p;
  p.top_p = 0.5;
  const int draws = 8000;
  check_distribution(l, p, draws);
  // The nucleus from the plain sort, and the token whose mass crosses top_p (the least likely one
  // in it). Its frequency alone sits inside the slack above, so the set of drawn tokens must be
  // the nucleus exactly: every token of it has at least `least` expected draws.
  const auto want = expected_distribution(l, p);
  size_t nucleus = 0, crossing = 0;
  for (size_t i = 0; i < l.size(); ++i)
    if (want[i] > 0) {
      ++nucleus;
      if (want[crossing] == 0 || want[i] < want[crossing]) crossing = i;
    }
  const double least = want[crossing] * draws;
  // P(a token of the nucleus is never drawn) <= nucleus * exp(-least): below 1e-6 here.
  ASSERT_GT(least, 15.0) << "the test needs more draws to see every nucleus token";
  const std::vector<int> count = draw_counts(l, p, draws);
  size_t drawn = 0;
  for (size_t i = 0; i < l.size(); ++i) drawn += count[i] > 0;
  EXPECT_GT(count[crossing], 0) << "the threshold-crossing token " << crossing << " (probability "
                                << want[crossing] << ") was never drawn";
  EXPECT_EQ(drawn, nucleus) << "tokens drawn against the nucleus of top_p " << p.top_p;
  // The same nucleus from the independent derivation of the scheme.
  test::RefSamplingParams r;
  r.temperature = 1.0f;
  r.top_p = 0.5f;
  const std::vector<bool> kept = test::reference_kept(l.data(), static_cast<int64_t>(l.size()), r);
  for (size_t i = 0; i < l.size(); ++i) EXPECT_EQ(kept[i], want[i] > 0) << "token " << i;

  // A nucleus of three whose crossing token holds a fifth of it: dropping that token moves
  // its mass to the other two, far outside the statistical slack.
  std::vector<float> small(5000, -20.0f);
  small[10] = 2.0f;
  small[4000] = 1.5f;
  small[77] = 1.2f;  // the crossing token: 0.49 + 0.30 < 0.9 <= all three
  p.top_p = 0.9;
  const auto w3 = expected_distribution(small, p);
  ASSERT_GT(w3[77], 0.2);
  ASSERT_EQ(std::count_if(w3.begin(), w3.end(), [](double x) { return x > 0; }), 3);
  check_distribution(small, p, 4000);
}

TEST(CpuSampler, DrawDependsOnlyOnSeedAndPosition) {
  std::mt19937 rng(11);
  std::normal_distribution<float> n;
  std::vector<float> target(300);
  for (auto& x : target) x = n(rng);
  SamplingParams p;
  p.temperature = 1.0;
  p.top_p = 0.95;
  CpuSampler s;
  const int32_t alone = sample_one(s, target, p, 1234, 17);
  // The same row among many others, at another index, with other seeds around it.
  std::vector<std::vector<float>> rows(40, target);
  for (auto& r : rows)
    for (auto& x : r) x += n(rng);
  rows[23] = target;
  Tensor t = logits_of(rows);
  std::vector<SampleTask> tasks(40);
  for (int i = 0; i < 40; ++i) {
    tasks[i].row = i;
    tasks[i].params = &p;
    tasks[i].seed = static_cast<uint64_t>(i);
    tasks[i].position = i;
  }
  tasks[23].seed = 1234;
  tasks[23].position = 17;
  std::vector<int32_t> out(40);
  s.sample(t, tasks, out);
  EXPECT_EQ(out[23], alone);
  int differ = 0;
  for (int pos = 0; pos < 50; ++pos) differ += sample_one(s, target, p, 1234, pos) != alone;
  EXPECT_GT(differ, 0) << "different positions should give different draws";
}

TEST(CpuSampler, LogprobsAreLogSoftmaxOfRawLogits) {
  std::mt19937 rng(2);
  std::normal_distribution<float> n(0, 3);
  std::vector<float> l(1000);
  for (auto& x : l) x = n(rng);
  SamplingParams p;
  p.temperature = 0.5;  // logprobs ignore temperature and penalties (vLLM's raw_logprobs)
  p.repetition_penalty = 1.3;
  p.logprobs = 5;
  long double mx = *std::max_element(l.begin(), l.end()), sum = 0;
  for (float x : l) sum += std::exp(static_cast<long double>(x) - mx);
  const long double lse = mx + std::log(sum);
  Tensor t = logits_of({l});
  TokenLogprob lp;
  SampleTask task;
  task.params = &p;
  task.seed = 3;
  task.logprob = &lp;
  std::vector<int32_t> prompt = {1, 2, 3};
  task.prompt = prompt;
  std::vector<int32_t> out(1);
  CpuSampler s;
  s.sample(t, {&task, 1}, out);
  EXPECT_EQ(lp.token_id, out[0]);
  EXPECT_NEAR(lp.logprob, static_cast<double>(l[out[0]] - lse), 1e-5);
  int rank = 1;
  for (float x : l) rank += x > l[out[0]];
  EXPECT_EQ(lp.rank, rank);
  std::vector<int> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  ASSERT_EQ(lp.top.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(lp.top[i].token_id, order[i]);
    EXPECT_NEAR(lp.top[i].logprob, static_cast<double>(l[order[i]] - lse), 1e-5);
  }
}

// kernels::sample on one host row: what the engine's device path draws.
int32_t device_draw(const std::vector<float>& row, const SamplingParams& p, uint64_t seed,
                    int64_t position) {
  Tensor ids = Tensor::empty({1}, DType::kI32);
  kernels::sample(ids, logits_of({row}),
                  kernels::sampling_rows_tensor({sampling_row(p, seed, position)}));
  return ids.ptr<int32_t>()[0];
}

// The independent derivation of the scheme (common/sampling_reference.h) for these parameters,
// set field by field here rather than through sampling_row.
int32_t scheme_draw(const std::vector<float>& row, const SamplingParams& p, uint64_t seed,
                    int64_t position) {
  test::RefSamplingParams r;
  r.temperature = p.temperature < 1e-5 ? 0.0f : static_cast<float>(p.temperature);
  r.top_p = static_cast<float>(p.top_p);
  r.min_p = static_cast<float>(p.min_p);
  r.top_k = p.top_k;
  r.seed = seed;
  r.step = static_cast<uint64_t>(position);
  return test::reference_sample(row, r);
}

// On a CPU build kernels::sample and the CPU sampler run the same row function, so agreeing with
// each other proves nothing: both must draw what the independent derivation draws.
TEST(CpuSampler, DrawsWhatTheDeviceSamplerDraws) {
  std::mt19937 rng(21);
  std::normal_distribution<float> n(0, 2);
  std::vector<float> l(3000);
  std::vector<SamplingParams> ps(5);
  ps[0].temperature = 0;
  ps[1].temperature = 1.0;
  ps[2].temperature = 0.7;
  ps[2].top_p = 0.9;
  ps[3].temperature = 1.2;
  ps[3].top_k = 50;
  ps[3].min_p = 0.02;
  ps[4].temperature = 0.8;
  ps[4].top_k = 20;
  ps[4].top_p = 0.5;
  CpuSampler s;
  int differ_from_argmax = 0;
  for (int trial = 0; trial < 40; ++trial) {
    for (auto& x : l) x = n(rng);
    const SamplingParams& p = ps[trial % ps.size()];
    const uint64_t seed = rng();
    const int64_t pos = trial * 3;
    ASSERT_TRUE(device_sampleable(p));
    const int32_t want = scheme_draw(l, p, seed, pos);
    differ_from_argmax += want != std::max_element(l.begin(), l.end()) - l.begin();
    EXPECT_EQ(sample_one(s, l, p, seed, pos), want) << trial;
    EXPECT_EQ(device_draw(l, p, seed, pos), want) << trial;
    // With penalties and bias the CPU sampler draws from the row modified as the device would:
    // the modification done here by hand.
    SamplingParams q = p;
    q.logit_bias = {{7, 4.0f}};
    q.frequency_penalty = 0.5;
    q.repetition_penalty = 1.2;
    EXPECT_FALSE(device_sampleable(q));
    std::vector<float> m = l;
    m[7] += 4.0f;
    for (int32_t id : {7, 100}) m[id] = m[id] > 0 ? m[id] / 1.2f : m[id] * 1.2f;  // seen once each
    m[100] -= 0.5f;  // frequency: output token 100 once
    EXPECT_EQ(sample_one(s, l, q, seed, pos, {7}, {100}), scheme_draw(m, p, seed, pos)) << trial;
  }
  EXPECT_GT(differ_from_argmax, 20) << "the trials should mostly draw something other than argmax";
}

TEST(CpuSampler, SuppressingTokensThatWouldNotWinChangesNothing) {
  // Gumbel-max without filters: masking a token other than the drawn one leaves the draw as it
  // was (the argmax of the others is unchanged), so a min_tokens request draws the same tokens as
  // an unmasked one as long as the masked ids would not have been drawn.
  std::mt19937 rng(8);
  std::normal_distribution<float> n;
  std::vector<float> l(500);
  SamplingParams p;
  p.temperature = 0.9;
  CpuSampler s;
  for (int trial = 0; trial < 50; ++trial) {
    for (auto& x : l) x = n(rng);
    const int32_t free = sample_one(s, l, p, 5, trial);
    const int32_t other = (free + 1 + trial) % 500;
    EXPECT_EQ(sample_one(s, l, p, 5, trial, {}, {}, {other}), free);
  }
}

}  // namespace
}  // namespace atom
