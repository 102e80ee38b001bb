#include "engine/verify_schedule.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace atom {

void confidence_calibrate(std::span<float> confidence, int K, std::span<const float> temperatures) {
  for (size_t i = 0; i < confidence.size(); ++i) {
    const double c = std::clamp(static_cast<double>(confidence[i]), 1e-6, 1 - 1e-6);
    if (temperatures.empty()) {
      confidence[i] = static_cast<float>(c);
      continue;
    }
    const double t = temperatures[i % static_cast<size_t>(K)];
    const double logit = std::log(c) - std::log1p(-c);
    confidence[i] = static_cast<float>(1.0 / (1.0 + std::exp(-logit / t)));
  }
}

ThroughputProfile::ThroughputProfile(std::vector<std::pair<int, double>> points)
    : points_(std::move(points)) {
  std::sort(points_.begin(), points_.end());
}

void ThroughputProfile::record(int tokens, double seconds) {
  if (!points_.empty() || tokens <= 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  const double b = tokens;
  s0_ = s0_ * kForget + 1;
  s1_ = s1_ * kForget + b;
  s2_ = s2_ * kForget + b * b;
  sy_ = sy_ * kForget + seconds;
  sxy_ = sxy_ * kForget + b * seconds;
  refit();
}

void ThroughputProfile::refit() {
  const double mb = s1_ / s0_, mt = sy_ / s0_;
  const double var = s2_ / s0_ - mb * mb;
  // Steps of one size say nothing about the slope.
  if (!(var > 0.01)) return;
  const double cov = sxy_ / s0_ - mb * mt;
  t1_ = std::max(0.0, cov / var);
  t0_ = std::max(0.0, mt - t1_ * mb);
  fitted_ = t0_ + t1_ > 0;
}

double ThroughputProfile::sps(int tokens) const {
  if (!points_.empty()) {
    if (tokens <= points_.front().first) return points_.front().second;
    if (tokens >= points_.back().first) return points_.back().second;
    const auto hi =
        std::lower_bound(points_.begin(), points_.end(), std::pair<int, double>(tokens, 0.0));
    if (hi->first == tokens) return hi->second;
    const auto lo = hi - 1;
    const double w = static_cast<double>(tokens - lo->first) / (hi->first - lo->first);
    return lo->second + w * (hi->second - lo->second);
  }
  if (!fitted_) return 1.0;
  return 1.0 / (t0_ + t1_ * tokens);
}

std::vector<int> verify_lengths_schedule(std::span<const float> confidence, int R, int K,
                                         const ThroughputProfile& profile) {
  std::vector<int> ell(static_cast<size_t>(R), 0);
  if (R <= 0 || K <= 0) return ell;
  const size_t N = static_cast<size_t>(R) * static_cast<size_t>(K);
  std::vector<double> survival(N);
  for (int r = 0; r < R; ++r) {
    double a = 1;
    for (int k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(r) * K + k;
      a *= std::max(0.0f, confidence[i]);
      survival[i] = a;
    }
  }
  // Every draft in descending survival (ties: the earlier sequence, then the earlier position, so
  // that a sequence's admitted drafts stay a prefix).
  std::vector<uint32_t> order(N);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t x, uint32_t y) { return survival[x] > survival[y]; });
  double tau = R;
  double theta = tau * profile.sps(R);
  size_t admitted = 0;
  for (; admitted < N; ++admitted) {
    const double next_tau = tau + survival[order[admitted]];
    const double next = next_tau * profile.sps(R + static_cast<int>(admitted) + 1);
    if (!(next > theta)) break;
    tau = next_tau;
    theta = next;
  }
  for (size_t m = 0; m < admitted; ++m) ++ell[order[m] / static_cast<uint32_t>(K)];
  return ell;
}

}  // namespace atom
