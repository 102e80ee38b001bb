// DSpark's confidence-scheduled verification: how many of its drafts each sequence sends to the
// target, from the drafter's confidence head and the engine's throughput profile (the DSpark
// paper's Hardware-Aware Prefix Scheduler, its Algorithm 1, as ROCm/ATOM runs it with
// `confidence_schedule`).
//
// A draft block of K tokens comes with a confidence c_k per position: the estimated probability
// that draft k is accepted given that drafts 0..k-1 were. Draft j survives (is accepted) with
// probability a_j = c_0 c_1 ... c_j. Verifying the first l_r drafts of each of R sequences costs a
// forward of B = R + sum l_r tokens and emits tau = R + sum_r sum_{j < l_r} a_rj tokens in
// expectation, so the engine's token rate is Theta = tau * SPS(B), SPS(B) the forward steps per
// second at B tokens. The scheduler admits drafts across all sequences in descending survival
// (which keeps each sequence's admitted drafts a prefix, a being non-increasing along a block) and
// stops at the first admission that does not raise Theta. Verifying fewer drafts never changes
// outputs: the target still decides every token, a dropped draft is drafted again next step.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace atom {

// Sequential Temperature Scaling, in place on confidence [R, K] (row-major): every c is clamped to
// [1e-6, 1 - 1e-6], then position k's becomes sigmoid(logit(c) / T_k). temperatures: empty (only
// the clamp) or K positive values (checked by the caller).
void confidence_calibrate(std::span<float> confidence, int K, std::span<const float> temperatures);

// The engine's forward steps per second as a function of the step's token count B.
class ThroughputProfile {
 public:
  // Measured as the engine runs (record()), t(B) = t0 + t1 B fit by least squares with older
  // steps forgotten geometrically; until it has steps of two different sizes SPS is 1 for every
  // B, so that every draft with a positive survival is verified (the static schedule).
  ThroughputProfile() = default;
  // Given: (tokens, steps per second) points, piecewise linear between them and flat outside
  // (ROCm/ATOM's SPS table); record() changes nothing. Points: tokens >= 1, SPS > 0, checked by
  // the caller.
  explicit ThroughputProfile(std::vector<std::pair<int, double>> points);

  // One forward step of `tokens` tokens took `seconds`.
  void record(int tokens, double seconds);
  double sps(int tokens) const;
  // The fit t(B) = t0 + t1 B (measured profiles; both 0 until it has two sizes).
  bool calibrated() const { return !points_.empty() || fitted_; }
  double t0() const { return t0_; }
  double t1() const { return t1_; }

  static constexpr double kForget = 0.98;  // each recorded step's weight decays by this per step

 private:
  void refit();
  std::vector<std::pair<int, double>> points_;  // given profile, sorted by tokens
  // Measured: weighted sums of 1, B, B^2, t, B t over the recorded steps.
  double s0_ = 0, s1_ = 0, s2_ = 0, sy_ = 0, sxy_ = 0;
  bool fitted_ = false;
  double t0_ = 0, t1_ = 0;
};

// The verify length l_r in 0..K of each of R sequences from confidence [R, K] (row-major, already
// calibrated; a position a sequence does not draft has confidence 0) and the profile.
std::vector<int> verify_lengths_schedule(std::span<const float> confidence, int R, int K,
                                         const ThroughputProfile& profile);

}  // namespace atom
