// The CPU rms_norm and rope kernels against values derived by hand and against the formulas
// written out here in double precision: the Gemma norm's (1 + w), per-head groups and the fused
// residual, NeoX (halves) and GPT-J (interleaved) rotation, partial rotation that leaves the
// remaining channels alone, and YaRN's scale. These paths are otherwise checked only GPU against
// CPU, which cannot catch a bug they share (a transformers fixture covers partial RoPE once a
// model using it lands).
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "common/compare.h"
#include "common/tensor_util.h"
#include "kernels/attn_res.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"

namespace atom::test {
namespace {

using kernels::RmsNormKind;

Tensor f32(const std::vector<float>& v, int64_t rows) {
  const int64_t cols = static_cast<int64_t>(v.size()) / rows;
  Tensor t = Tensor::empty({rows, cols}, DType::kF32);
  std::copy(v.begin(), v.end(), t.ptr<float>());
  return t;
}

Tensor vec(const std::vector<float>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kF32);
  std::copy(v.begin(), v.end(), t.ptr<float>());
  return t;
}

void expect_values(const Tensor& got, const std::vector<double>& want, double tol,
                   const std::string& what) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got.ptr<float>()[i], want[i], tol) << what << ", element " << i;
}

TEST(CpuRmsNorm, HandDerivedLlamaAndGemma) {
  // x = [1, 2, 3, 4]: mean(x²) = 7.5; with eps 0.5 the rms is sqrt(8) = 2√2 exactly.
  const Tensor x = f32({1, 2, 3, 4}, 1);
  const double r = 2 * std::numbers::sqrt2;
  Tensor out = Tensor::empty({1, 4}, DType::kF32);
  kernels::rms_norm(out, x, nullptr, vec({1, 0.5f, 2, -1}), 0.5f, RmsNormKind::kLlama);
  expect_values(out, {1 / r, 1 / r, 6 / r, -4 / r}, 1e-6, "llama");
  // Gemma stores w - 1: the same output from weights one lower.
  kernels::rms_norm(out, x, nullptr, vec({0, -0.5f, 1, -2}), 0.5f, RmsNormKind::kGemma);
  expect_values(out, {1 / r, 1 / r, 6 / r, -4 / r}, 1e-6, "gemma (1 + w)");
  // Zero weights: Llama gives zeros, Gemma the normalised input.
  kernels::rms_norm(out, x, nullptr, vec({0, 0, 0, 0}), 0.5f, RmsNormKind::kGemma);
  expect_values(out, {1 / r, 2 / r, 3 / r, 4 / r}, 1e-6, "gemma, w = 0");
  kernels::rms_norm(out, x, nullptr, vec({0, 0, 0, 0}), 0.5f, RmsNormKind::kLlama);
  expect_values(out, {0, 0, 0, 0}, 0, "llama, w = 0");
}

TEST(CpuRmsNorm, EpsilonCountsWhereItMatters) {
  // Activations of 1e-3: mean(x²) = 7.5e-6 is comparable to eps = 1e-5, so dropping eps or
  // scaling it by ten moves every output by tens of percent.
  const Tensor x = f32({1e-3f, 2e-3f, 3e-3f, 4e-3f}, 1);
  Tensor out = Tensor::empty({1, 4}, DType::kF32);
  for (const float eps : {1e-5f, 1e-6f}) {
    const double inv = 1 / std::sqrt(7.5e-6 + static_cast<double>(eps));
    kernels::rms_norm(out, x, nullptr, vec({1, 1, 1, 1}), eps, RmsNormKind::kLlama);
    expect_values(out, {1e-3 * inv, 2e-3 * inv, 3e-3 * inv, 4e-3 * inv}, 1e-5,
                  "eps " + std::to_string(eps));
  }
}

TEST(CpuRmsNorm, GroupsAndResidualMatchTheFormula) {
  // rows of 3 groups of 8 (per-head norms), with the fused residual add; Llama and Gemma.
  const int64_t rows = 5, dim = 8, width = 24;
  const Tensor x = random_cpu({rows, width}, DType::kF32, 1, -2, 2);
  const Tensor res0 = random_cpu({rows, width}, DType::kF32, 2, -2, 2);
  const Tensor w = random_cpu({dim}, DType::kF32, 3, -0.5f, 1.5f);
  for (const RmsNormKind kind : {RmsNormKind::kLlama, RmsNormKind::kGemma}) {
    Tensor res = res0.clone();
    Tensor out = Tensor::empty({rows, width}, DType::kF32);
    kernels::rms_norm(out, x, &res, w, 1e-6f, kind);
    std::vector<double> want, want_res;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < width / dim; ++g) {
        double ss = 0;
        std::vector<double> v(dim);
        for (int64_t i = 0; i < dim; ++i) {
          const int64_t j = r * width + g * dim + i;
          v[i] = static_cast<double>(x.ptr<float>()[j]) + res0.ptr<float>()[j];
          ss += v[i] * v[i];
        }
        const double inv = 1 / std::sqrt(ss / dim + 1e-6);
        for (int64_t i = 0; i < dim; ++i) {
          const double wi = w.ptr<float>()[i];
          want.push_back(v[i] * inv * (kind == RmsNormKind::kGemma ? 1 + wi : wi));
          want_res.push_back(v[i]);
        }
      }
    expect_values(out, want, 1e-5, kind == RmsNormKind::kGemma ? "gemma" : "llama");
    expect_values(res, want_res, 1e-6, "residual");
  }
}

// rope on q [T, hq * head_dim] and k [T, hk * head_dim] at the given positions.
void run_rope(Tensor& q, Tensor& k, const std::vector<int32_t>& pos,
              const std::vector<float>& inv_freq, const kernels::RopeArgs& a) {
  const Tensor p = i32(pos);
  kernels::rope(q, k, p, vec(inv_freq), a);
}

TEST(CpuRope, HandDerivedQuarterAndHalfTurns) {
  // inv_freq [π/2, π] at position 1: the first pair turns a quarter, the second half a turn.
  // A quarter turn takes (x1, x2) to (-x2, x1) (transformers: x cos + rotate_half(x) sin).
  const std::vector<float> inv = {std::numbers::pi_v<float> / 2, std::numbers::pi_v<float>};
  struct Case {
    const char* name;
    int head_dim, rot_dim;
    bool interleaved;
    std::vector<double> want;  // from q = 1, 2, ..., head_dim
  };
  const Case cases[] = {
      // halves: pairs (0, 2) and (1, 3)
      {"neox", 4, 4, false, {-3, -2, 1, -4}},
      // interleaved: pairs (0, 1) and (2, 3)
      {"interleaved", 4, 4, true, {-2, 1, -3, -4}},
      // partial: the first 4 of 8 channels, pairs (0, 2) and (1, 3); 5..8 untouched
      {"partial neox", 8, 4, false, {-3, -2, 1, -4, 5, 6, 7, 8}},
      {"partial interleaved", 8, 4, true, {-2, 1, -3, -4, 5, 6, 7, 8}},
  };
  for (const Case& c : cases) {
    std::vector<float> qv, kv;
    for (int h = 0; h < 2; ++h)  // two query heads, one key head: each head rotates alike
      for (int i = 0; i < c.head_dim; ++i) qv.push_back(static_cast<float>(i + 1));
    for (int i = 0; i < c.head_dim; ++i) kv.push_back(static_cast<float>(i + 1));
    Tensor q = f32(qv, 1), k = f32(kv, 1);
    run_rope(q, k, {1}, inv, {c.head_dim, c.rot_dim, 1.0f, c.interleaved});
    std::vector<double> two = c.want;
    two.insert(two.end(), c.want.begin(), c.want.end());
    expect_values(q, two, 1e-6, std::string(c.name) + " q");
    expect_values(k, c.want, 1e-6, std::string(c.name) + " k");
  }
  // Position 0 leaves everything as it was; position 2 turns the first pair half a turn and
  // the second a whole one.
  Tensor q = f32({1, 2, 3, 4}, 1), k = f32({1, 2, 3, 4}, 1);
  run_rope(q, k, {0}, inv, {4, 4, 1.0f, false});
  expect_values(q, {1, 2, 3, 4}, 0, "position 0");
  run_rope(q, k, {2}, inv, {4, 4, 1.0f, false});
  expect_values(q, {-1, 2, -3, 4}, 1e-6, "position 2");
}

TEST(CpuRope, MatchesTheFormulaForEveryLayout) {
  // Random q, k and positions; angle = pos * inv_freq[i] (in fp32, as transformers), rotated in
  // double here: out1 = s (x1 cos - x2 sin), out2 = s (x2 cos + x1 sin), other channels as given.
  struct Case {
    int head_dim, rot_dim;
    bool interleaved;
    float scale;
  };
  for (const Case& c :
       {Case{16, 16, false, 1.0f}, Case{16, 16, true, 1.0f}, Case{32, 16, false, 1.0f},
        Case{32, 8, true, 1.0f}, Case{16, 16, false, 1.3f}, Case{24, 12, true, 0.7f}}) {
    SCOPED_TRACE(::testing::Message() << c.head_dim << "/" << c.rot_dim << " interleaved "
                                      << c.interleaved << " scale " << c.scale);
    const int hq = 3, hk = 2, T = 6;
    const Tensor q0 = random_cpu({T, hq * c.head_dim}, DType::kF32, 10, -2, 2);
    const Tensor k0 = random_cpu({T, hk * c.head_dim}, DType::kF32, 11, -2, 2);
    const std::vector<int32_t> pos = {0, 1, 7, 30, 511, 4095};
    std::vector<float> inv(static_cast<size_t>(c.rot_dim / 2));
    for (int i = 0; i < c.rot_dim / 2; ++i)
      inv[i] = static_cast<float>(1 / std::pow(10000.0, 2.0 * i / c.rot_dim));
    Tensor q = q0.clone(), k = k0.clone();
    run_rope(q, k, pos, inv, {c.head_dim, c.rot_dim, c.scale, c.interleaved});
    for (const auto& [x0, heads, got] :
         {std::tuple<const Tensor&, int, const Tensor&>{q0, hq, q}, {k0, hk, k}}) {
      std::vector<double> want(static_cast<size_t>(x0.numel()));
      for (int64_t i = 0; i < x0.numel(); ++i) want[i] = x0.ptr<float>()[i];
      const int half = c.rot_dim / 2;
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < half; ++i) {
            const double angle = static_cast<float>(pos[t]) * inv[i];
            const int64_t base = (static_cast<int64_t>(t) * heads + h) * c.head_dim;
            const int64_t i1 = base + (c.interleaved ? 2 * i : i);
            const int64_t i2 = base + (c.interleaved ? 2 * i + 1 : i + half);
            const double x1 = x0.ptr<float>()[i1], x2 = x0.ptr<float>()[i2];
            want[i1] = c.scale * (x1 * std::cos(angle) - x2 * std::sin(angle));
            want[i2] = c.scale * (x2 * std::cos(angle) + x1 * std::sin(angle));
          }
      expect_values(got, want, 2e-5, "");
    }
  }
}

// Kimi-K3's attention residuals: the softmax over rows of (RMS-normalised row) · w mixing the raw
// rows, written out here in double; one row is that row exactly; rows past n are not read.
TEST(AttnRes, MixMatchesTheFormula) {
  const int64_t T = 3, B = 5, D = 24;
  Tensor bank = random_cpu({T, B, D}, DType::kF32, 41, -2, 2);
  Tensor w = random_cpu({D}, DType::kF32, 42, -1, 1);
  const float eps = 1e-5f;
  for (const int64_t n : {1, 3, 4}) {
    SCOPED_TRACE(n);
    Tensor out = Tensor::empty({T, D}, DType::kF32);
    kernels::attn_res(out, bank, n, w, eps);
    double spread = 0;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> s(static_cast<size_t>(n));
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        const float* r = bank.ptr<float>() + (t * B + j) * D;
        double ss = 0, dot = 0;
        for (int64_t c = 0; c < D; ++c) {
          ss += double(r[c]) * r[c];
          dot += double(r[c]) * w.ptr<float>()[c];
        }
        s[j] = dot / std::sqrt(ss / D + eps);
        mx = std::max(mx, s[j]);
      }
      for (auto& v : s) sum += (v = std::exp(v - mx));
      for (int64_t c = 0; c < D; ++c) {
        double want = 0;
        for (int64_t j = 0; j < n; ++j) want += s[j] / sum * bank.ptr<float>()[(t * B + j) * D + c];
        const float got = out.ptr<float>()[t * D + c];
        if (n == 1) {
          EXPECT_EQ(got, bank.ptr<float>()[t * B * D + c]);
        } else {
          EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::abs(want)));
        }
      }
      if (n > 1) spread = std::max(spread, std::abs(s[0] - s[1]) / sum);
    }
    if (n > 1) {
      EXPECT_GT(spread, 0.05) << "the weights should not be uniform";
    }
  }
  Tensor out = Tensor::empty({T, D}, DType::kF32);
  EXPECT_ERROR_CONTAINS(kernels::attn_res(out, bank, 6, w, eps), "6 rows");
  EXPECT_ERROR_CONTAINS(kernels::attn_res(out, bank, 0, w, eps), "0 rows");
}

}  // namespace
}  // namespace atom::test
