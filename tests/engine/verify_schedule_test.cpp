// DSpark's confidence-scheduled verify lengths (engine/verify_schedule.h) against the paper's
// Algorithm 1 written as its loop (each sequence's next draft a candidate, the best one admitted
// while the rate rises), which is independent of the module's one sort over all drafts; hand-worked
// cases; the temperature scaling in closed form; the throughput profile's fit and table.
#include "engine/verify_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace atom {
namespace {

// Algorithm 1 as a loop: the candidates are each sequence's next draft (its survival the
// product of its confidences so far); the best is admitted while Theta = tau * SPS(B) rises.
std::vector<int> algorithm1(const std::vector<float>& c, int R, int K,
                            const ThroughputProfile& profile) {
  std::vector<int> ell(static_cast<size_t>(R), 0);
  std::vector<double> surv(static_cast<size_t>(R), 1.0);  // survival of the admitted prefix
  double tau = R;
  int B = R;
  double theta = tau * profile.sps(B);
  for (;;) {
    int best = -1;
    double a_best = -1;
    for (int r = 0; r < R; ++r) {
      if (ell[r] == K) continue;
      const double a = surv[r] * std::max(0.0f, c[static_cast<size_t>(r * K + ell[r])]);
      if (a > a_best) {  // strict: the earlier sequence on a tie
        a_best = a;
        best = r;
      }
    }
    if (best < 0) break;
    const double next = (tau + a_best) * profile.sps(B + 1);
    if (!(next > theta)) break;
    tau += a_best;
    ++B;
    theta = next;
    surv[best] = a_best;
    ++ell[best];
  }
  return ell;
}

std::vector<std::pair<int, double>> table_of(double (*sps)(int), int max_b) {
  std::vector<std::pair<int, double>> t;
  for (int b = 1; b <= max_b; ++b) t.emplace_back(b, sps(b));
  return t;
}

TEST(VerifySchedule, HandWorkedCases) {
  // One sequence, SPS 10, 9, 8, 7 at 1..4 tokens; survival 0.9, 0.45, 0.225:
  // Theta 10, 1.9 * 9 = 17.1, 2.35 * 8 = 18.8, 2.575 * 7 = 18.025: two drafts.
  ThroughputProfile p1({{1, 10.0}, {2, 9.0}, {3, 8.0}, {4, 7.0}});
  EXPECT_EQ(verify_lengths_schedule(std::vector<float>{0.9f, 0.5f, 0.5f}, 1, 3, p1),
            std::vector<int>({2}));
  // Two sequences, SPS(B) = 1 / (1 + B / 4); survival 0.9, 0.81 and 0.5, 0.45: Theta 1.333,
  // 2.9 / 1.75 = 1.657, 3.71 / 2 = 1.855, 4.21 / 2.25 = 1.871, 4.66 / 2.5 = 1.864: 2 and 1.
  ThroughputProfile p2(table_of([](int b) { return 1.0 / (1.0 + b / 4.0); }, 8));
  EXPECT_EQ(verify_lengths_schedule(std::vector<float>{0.9f, 0.9f, 0.5f, 0.9f}, 2, 2, p2),
            std::vector<int>({2, 1}));
  // A cost per token and nothing else (SPS = 1 / B): Theta is the mean survival per token, which
  // a draft (survival < 1) only lowers: nothing is verified.
  ThroughputProfile per_token(table_of([](int b) { return 1.0 / b; }, 40));
  EXPECT_EQ(verify_lengths_schedule(std::vector<float>(12, 0.99f), 3, 4, per_token),
            std::vector<int>({0, 0, 0}));
  // A flat profile verifies every draft with a positive survival, and none past a zero.
  ThroughputProfile flat({{1, 3.0}});
  EXPECT_EQ(
      verify_lengths_schedule(std::vector<float>{0.2f, 0.1f, 0.0f, 0.7f, 0.6f, 0.5f}, 2, 3, flat),
      std::vector<int>({2, 3}));
  // The first drop ends the admission even when a later size is faster (the paper's early stop,
  // which keeps the schedule non-anticipating): SPS 1, 0.4, 5.
  ThroughputProfile saw({{1, 1.0}, {2, 0.4}, {3, 5.0}});
  EXPECT_EQ(verify_lengths_schedule(std::vector<float>{0.9f, 0.9f}, 1, 2, saw),
            std::vector<int>({0}));
}

TEST(VerifySchedule, MatchesAlgorithmOneOnRandomBlocks) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const std::vector<ThroughputProfile> profiles = {
      ThroughputProfile(table_of([](int b) { return 1.0 / (8.0 + b); }, 80)),
      ThroughputProfile(table_of([](int b) { return 1.0 / (2.0 + 0.5 * b); }, 80)),
      ThroughputProfile({{1, 100.0}, {16, 90.0}, {40, 40.0}, {64, 30.0}}),
      ThroughputProfile({{1, 1.0}}),
  };
  int nonzero = 0, partial = 0, cases = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int R = 1 + static_cast<int>(rng() % 9);
    const int K = 1 + static_cast<int>(rng() % 8);
    std::vector<float> c(static_cast<size_t>(R * K));
    for (float& x : c) x = u(rng);
    // Some sequences want fewer drafts (their later positions 0), as the proposer gives them.
    if (trial % 3 == 0)
      for (int k = K / 2; k < K; ++k) c[static_cast<size_t>(k)] = 0;
    for (const ThroughputProfile& p : profiles) {
      const std::vector<int> want = algorithm1(c, R, K, p);
      const std::vector<int> got = verify_lengths_schedule(c, R, K, p);
      ASSERT_EQ(got, want) << "trial " << trial << ", R " << R << ", K " << K;
      ++cases;
      for (int l : got) {
        nonzero += l > 0;
        partial += l > 0 && l < K;
      }
    }
  }
  // The cases cover all three outcomes per sequence (none, some, all of its drafts).
  EXPECT_GT(nonzero, cases / 4);
  EXPECT_GT(partial, cases / 8);
  std::printf("%d cases, %d sequences verifying drafts, %d only some of them\n", cases, nonzero,
              partial);
}

TEST(VerifySchedule, TemperatureScalingIsSigmoidOfLogitOverT) {
  std::vector<float> c = {0.9f, 0.2f, 0.0f, 1.0f, 0.5f, 0.7f};
  confidence_calibrate(c, 3, std::vector<float>{2.0f, 0.5f, 1.0f});
  auto sts = [](double x, double t) { return 1.0 / (1.0 + std::exp(-std::log(x / (1 - x)) / t)); };
  EXPECT_NEAR(c[0], sts(0.9, 2.0), 1e-6);  // 0.75
  EXPECT_NEAR(c[0], 0.75, 1e-6);
  EXPECT_NEAR(c[1], sts(0.2, 0.5), 1e-6);  // 1 / 17
  EXPECT_NEAR(c[1], 1.0 / 17, 1e-6);
  EXPECT_NEAR(c[2], 1e-6, 1e-9);                // clamped, then T = 1
  EXPECT_NEAR(c[3], sts(1 - 1e-6, 2.0), 1e-6);  // clamped, then T = 2
  EXPECT_NEAR(c[4], sts(0.5, 0.5), 1e-6);       // 0.5 whatever T
  EXPECT_NEAR(c[5], sts(0.7, 1.0), 1e-6);
  std::vector<float> d = {0.0f, 0.3f, 1.0f};
  confidence_calibrate(d, 3, {});
  EXPECT_EQ(d, std::vector<float>({1e-6f, 0.3f, static_cast<float>(1 - 1e-6)}));
}

TEST(VerifySchedule, MeasuredProfileFitsTheStepTimes) {
  ThroughputProfile p;
  EXPECT_FALSE(p.calibrated());
  EXPECT_EQ(p.sps(1), 1.0);
  EXPECT_EQ(p.sps(500), 1.0);
  // Steps of one size say nothing about the slope: still the static schedule.
  std::vector<std::pair<double, double>> steps;
  for (int i = 0; i < 5; ++i) {
    p.record(7, 0.02);
    steps.emplace_back(7, 0.02);
  }
  EXPECT_FALSE(p.calibrated());
  EXPECT_EQ(p.sps(100), 1.0);
  for (int b : {1, 6, 30, 2, 64, 9}) {
    p.record(b, 0.01 + 0.001 * b);
    steps.emplace_back(b, 0.01 + 0.001 * b);
  }
  ASSERT_TRUE(p.calibrated());
  // Weighted least squares, step i of n weighing kForget^(n - 1 - i), by its normal equations.
  double w = 1, a00 = 0, a01 = 0, a11 = 0, y0 = 0, y1 = 0;
  for (size_t i = steps.size(); i-- > 0; w *= ThroughputProfile::kForget) {
    const auto [b, t] = steps[i];
    a00 += w, a01 += w * b, a11 += w * b * b, y0 += w * t, y1 += w * b * t;
  }
  const double det = a00 * a11 - a01 * a01;
  EXPECT_NEAR(p.t0(), (a11 * y0 - a01 * y1) / det, 1e-12);
  EXPECT_NEAR(p.t1(), (a00 * y1 - a01 * y0) / det, 1e-12);
  // The 7-token steps of 0.02 s (the line gives 0.017) pull the fit off the line.
  EXPECT_GT(std::abs(p.t0() - 0.01), 1e-4);
  EXPECT_NEAR(p.sps(20), 1.0 / (p.t0() + 20 * p.t1()), 1e-9);
  // Old steps are forgotten: after many steps on the line the fit is the line.
  for (int i = 0; i < 2000; ++i) p.record(1 + i % 50, 0.01 + 0.001 * (1 + i % 50));
  EXPECT_NEAR(p.t0(), 0.01, 1e-9);
  EXPECT_NEAR(p.t1(), 0.001, 1e-10);
  EXPECT_NEAR(p.sps(40), 1.0 / 0.05, 1e-6);
  // Garbage times are ignored.
  p.record(10, -1);
  p.record(10, std::nan(""));
  p.record(0, 1);
  EXPECT_NEAR(p.t1(), 0.001, 1e-10);
}

TEST(VerifySchedule, GivenProfileInterpolates) {
  ThroughputProfile p({{16, 50.0}, {4, 100.0}, {64, 20.0}});
  EXPECT_TRUE(p.calibrated());
  EXPECT_EQ(p.sps(1), 100.0);  // flat before the first point
  EXPECT_EQ(p.sps(4), 100.0);
  EXPECT_DOUBLE_EQ(p.sps(10), 75.0);
  EXPECT_EQ(p.sps(16), 50.0);
  EXPECT_DOUBLE_EQ(p.sps(40), 35.0);
  EXPECT_EQ(p.sps(1000), 20.0);  // flat after the last
  p.record(8, 1.0);              // a given profile does not learn
  EXPECT_DOUBLE_EQ(p.sps(10), 75.0);
}

}  // namespace
}  // namespace atom
