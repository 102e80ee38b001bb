// Tensor comparisons that can fail. Every helper here
//   - fails (ADD_FAILURE, naming both shapes) when the shapes differ: a missing or extra row must
//     not be compared as if it were another one;
//   - fails on a NaN or an infinity that the other side does not hold in the same place: NaN
//     compares false with everything, so a plain std::max(m, |a - b|) would skip it, and a
//     "greater than" check on an error that came out NaN or infinite would pass;
//   - returns +inf in both cases, so that an EXPECT_LE on the result fails as well.
// Use them for every numeric comparison in tests/ (docs/testing.md).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "core/convert.h"
#include "core/tensor.h"

namespace atom::test {

// A contiguous F32 copy on the host of a float tensor of any dtype and device.
inline Tensor f32_host(const Tensor& t) {
  Tensor h = t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu());
  return h.dtype() == DType::kF32 ? h : tensor_cast_cpu(h, DType::kF32);
}

// Whether a and b have the same shape; a failure naming both shapes otherwise.
inline bool expect_same_shape(const Tensor& a, const Tensor& b, const std::string& what = "") {
  if (a.shape() == b.shape()) return true;
  ADD_FAILURE() << (what.empty() ? "" : what + ": ") << "shape mismatch: " << shape_str(a.shape())
                << " against " << shape_str(b.shape());
  return false;
}

struct TensorDiff {
  bool same_shape = true;
  float max_abs = 0;       // +inf when the shapes differ or a non-finite value is unmatched
  int64_t at = -1;         // flat index of the largest finite difference
  int64_t non_finite = 0;  // positions where a NaN or an infinity is not matched exactly
  int64_t first_non_finite = -1;
  float a_bad = 0, b_bad = 0;  // the values at first_non_finite
  double num = 0, den = 0;     // sum (a - b)², sum b² over the finite positions
};

// The element-wise comparison of a and b (any float dtypes, any devices). Equal values count as
// equal, infinities included (a masked -inf on both sides); a NaN never matches, not even NaN.
inline TensorDiff tensor_diff(const Tensor& a, const Tensor& b) {
  TensorDiff d;
  if (a.shape() != b.shape()) {
    d.same_shape = false;
    d.max_abs = std::numeric_limits<float>::infinity();
    return d;
  }
  const Tensor x = f32_host(a), y = f32_host(b);
  const float* p = x.ptr<float>();
  const float* q = y.ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (p[i] == q[i]) {
      d.den += static_cast<double>(q[i]) * q[i] * std::isfinite(q[i]);
      continue;
    }
    if (!std::isfinite(p[i]) || !std::isfinite(q[i])) {
      if (d.non_finite++ == 0) {
        d.first_non_finite = i;
        d.a_bad = p[i];
        d.b_bad = q[i];
      }
      continue;
    }
    const float e = std::abs(p[i] - q[i]);
    if (e > d.max_abs) {
      d.max_abs = e;
      d.at = i;
    }
    d.num += static_cast<double>(p[i] - q[i]) * (p[i] - q[i]);
    d.den += static_cast<double>(q[i]) * q[i];
  }
  if (d.non_finite) d.max_abs = std::numeric_limits<float>::infinity();
  return d;
}

// Reports what makes `d` unusable (a shape mismatch, unmatched NaN/Inf) as a test failure.
inline bool expect_comparable(const TensorDiff& d, const Tensor& a, const Tensor& b,
                              const std::string& what = "") {
  const std::string w = what.empty() ? "" : what + ": ";
  if (!d.same_shape) {
    ADD_FAILURE() << w << "shape mismatch: " << shape_str(a.shape()) << " against "
                  << shape_str(b.shape());
    return false;
  }
  if (d.non_finite) {
    ADD_FAILURE() << w << d.non_finite << " unmatched NaN/Inf value(s) in " << shape_str(a.shape())
                  << ", the first at flat index " << d.first_non_finite << ": " << d.a_bad
                  << " against " << d.b_bad;
    return false;
  }
  return true;
}

// max |a - b|; a failure (and +inf) on a shape mismatch or an unmatched NaN/Inf.
inline float max_abs_diff(const Tensor& a, const Tensor& b, const std::string& what = "") {
  const TensorDiff d = tensor_diff(a, b);
  expect_comparable(d, a, b, what);
  return d.max_abs;
}

// ||a - b|| / ||b|| (||a - b|| when b is all zeros); a failure (and +inf) on a shape mismatch or
// an unmatched NaN/Inf, so that neither EXPECT_LE nor EXPECT_GT on it can pass by accident.
inline double rel_err(const Tensor& a, const Tensor& b, const std::string& what = "") {
  const TensorDiff d = tensor_diff(a, b);
  if (!expect_comparable(d, a, b, what)) return std::numeric_limits<double>::infinity();
  return d.den > 0 ? std::sqrt(d.num / d.den) : std::sqrt(d.num);
}

// max |got - want| / max |want| (the largest difference against the largest value); a failure
// (and +inf) on a shape mismatch or an unmatched NaN/Inf, as rel_err.
inline double max_rel_diff(const Tensor& got, const Tensor& want, const std::string& what = "") {
  const TensorDiff d = tensor_diff(got, want);
  if (!expect_comparable(d, got, want, what)) return std::numeric_limits<double>::infinity();
  const Tensor w = f32_host(want);
  double m = 0;
  for (int64_t i = 0; i < w.numel(); ++i)
    m = std::max(m, static_cast<double>(std::abs(w.ptr<float>()[i])));
  return m > 0 ? d.max_abs / m : d.max_abs;
}

// Expects max |got - want| <= tol, shapes equal and no NaN/Inf; returns the measured max (for
// printing, so that tolerances can be kept near the measured error).
inline float expect_logits_near(const Tensor& got, const Tensor& want, float tol,
                                const std::string& what = "") {
  const TensorDiff d = tensor_diff(got, want);
  if (!expect_comparable(d, got, want, what)) return d.max_abs;
  const int64_t cols = got.dim() > 1 ? got.size(got.dim() - 1) : 1;
  EXPECT_LE(d.max_abs, tol) << (what.empty() ? "" : what + ": ") << "max |difference| " << d.max_abs
                            << " at row " << d.at / cols << ", column " << d.at % cols;
  return d.max_abs;
}

}  // namespace atom::test
