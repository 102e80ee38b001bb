// kernels::cpu::linear_fp8 (the FP8 linear's reference) against hand-derived cases and against
// an independent path written here: the activations quantised by the definition in linear_fp8.h,
// both operands dequantised to double and multiplied in double.
#include "kernels/linear_fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <vector>

#include "common/compare.h"
#include "common/tensor_util.h"
#include "core/half.h"

namespace atom {
namespace {

using kernels::Fp8Activation;
using kernels::Fp8Granularity;
using kernels::Fp8Weight;

Tensor f32(Shape shape, const std::vector<float>& v) {
  Tensor t = Tensor::empty(std::move(shape), DType::kF32);
  EXPECT_EQ(static_cast<size_t>(t.numel()), v.size());
  std::memcpy(t.data(), v.data(), v.size() * sizeof(float));
  return t;
}

Tensor f8(Shape shape, const std::vector<uint8_t>& v) {
  Tensor t = Tensor::empty(std::move(shape), DType::kF8E4M3);
  EXPECT_EQ(static_cast<size_t>(t.numel()), v.size());
  std::memcpy(t.data(), v.data(), v.size());
  return t;
}

// e4m3 codes by their bit patterns (sign | exponent (bias 7) << 3 | mantissa).
TEST(LinearFp8Cpu, E4m3KnownCodes) {
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x40), 2.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), 0.001953125f);  // smallest subnormal, 2^-9
  EXPECT_EQ(f8e4m3_to_f32(0x08), 0.015625f);     // smallest normal, 2^-6
  EXPECT_EQ(f8e4m3_to_f32(0x3c), 1.5f);
  EXPECT_EQ(f32_to_f8e4m3(1.0f), 0x38);
  EXPECT_EQ(f32_to_f8e4m3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(f32_to_f8e4m3(-1000.0f), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3(1.0625f), 0x38);   // tie between 1 and 1.125: even mantissa
  EXPECT_EQ(f32_to_f8e4m3(1.1875f), 0x3a);   // tie between 1.125 and 1.25: even (1.25)
  EXPECT_EQ(f32_to_f8e4m3(149.333f), 0x71);  // 144 (spacing 16 in [128, 256))
  EXPECT_EQ(f8e4m3_to_f32(0x71), 144.0f);
}

// Token-dynamic activations, tensor-scaled weight, by hand: x = [3, 1]: amax 3, s = 3/448,
// x / s = [448, 149.33] -> codes 448, 144 -> x̂ = [3, 144 * 3/448]. w = [1, 2] · 0.5.
// out = (3 · 1 + (144 · 3 / 448) · 2) · 0.5 + bias 0.25.
TEST(LinearFp8Cpu, HandDerivedTokenTensor) {
  Fp8Weight w;
  w.w = f8({1, 2}, {0x38, 0x40});
  w.scale = f32({1}, {0.5f});
  w.granularity = Fp8Granularity::kTensor;
  w.activation = Fp8Activation::kTokenDynamic;
  Tensor x = f32({1, 2}, {3.0f, 1.0f});
  Tensor out = Tensor::empty({1, 1}, DType::kF32);
  kernels::linear_fp8(out, x, w, f32({1}, {0.25f}));
  const double want = (3.0 * 1.0 + (144.0 * 3.0 / 448.0) * 2.0) * 0.5 + 0.25;
  EXPECT_NEAR(out.ptr<float>()[0], want, 1e-6);
}

// Block-dynamic activations over 2 groups of 2 and a 2x2-block weight (N = 3: a partial block of
// rows; K = 3: a partial group/block of one column). Row x = [1, -0.5 | 7]: group 0 amax 1,
// s0 = 1/448, codes 448 and -224 (exact); group 1 amax 7, s1 = 7/448, code 448 -> x̂ exact.
// Weight codes all 1.0 (0x38) with block scales [[1, 2], [3, 4]]: row n gets
// (1 - 0.5) · scale[n / 2][0] + 7 · scale[n / 2][1].
TEST(LinearFp8Cpu, HandDerivedBlockPartial) {
  Fp8Weight w;
  w.w = f8({3, 3}, std::vector<uint8_t>(9, 0x38));
  w.scale = f32({2, 2}, {1, 2, 3, 4});
  w.granularity = Fp8Granularity::kBlock;
  w.block_n = 2;
  w.block_k = 2;
  w.activation = Fp8Activation::kBlockDynamic;
  Tensor x = f32({1, 3}, {1.0f, -0.5f, 7.0f});
  Tensor out = Tensor::empty({1, 3}, DType::kF32);
  kernels::linear_fp8(out, x, w);
  EXPECT_NEAR(out.ptr<float>()[0], 0.5 * 1 + 7 * 2, 1e-5);
  EXPECT_NEAR(out.ptr<float>()[1], 0.5 * 1 + 7 * 2, 1e-5);
  EXPECT_NEAR(out.ptr<float>()[2], 0.5 * 3 + 7 * 4, 1e-5);
}

// Static activation scale: saturation at 448, and an all-zero row (dynamic) stays finite.
TEST(LinearFp8Cpu, StaticSaturatesAndZeroRowIsFinite) {
  Fp8Weight w;
  w.w = f8({1, 2}, {0x38, 0x38});
  w.scale = f32({1}, {1.0f});
  w.granularity = Fp8Granularity::kChannel;
  w.activation = Fp8Activation::kTensorStatic;
  w.input_scale = f32({1}, {1.0f});
  Tensor x = f32({1, 2}, {1000.0f, -1.0f});
  Tensor out = Tensor::empty({1, 1}, DType::kF32);
  kernels::linear_fp8(out, x, w);
  EXPECT_EQ(out.ptr<float>()[0], 448.0f - 1.0f);

  w.activation = Fp8Activation::kTokenDynamic;
  Tensor z = f32({1, 2}, {0.0f, 0.0f});
  kernels::linear_fp8(out, z, w, f32({1}, {0.5f}));
  EXPECT_EQ(out.ptr<float>()[0], 0.5f);
}

// The independent path: quantise by the definition, dequantise both operands, multiply in double.
std::vector<double> direct(const Tensor& x, const Fp8Weight& w, const Tensor& bias) {
  const int64_t M = x.size(0), K = x.size(1), N = w.w.size(0);
  std::vector<double> xd(static_cast<size_t>(M * K));
  const float* xp = x.ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    const float* r = xp + m * K;
    auto quant_range = [&](int64_t k0, int64_t k1, float s) {
      for (int64_t k = k0; k < k1; ++k)
        xd[m * K + k] = static_cast<double>(f8e4m3_to_f32(f32_to_f8e4m3(r[k] / s))) * s;
    };
    auto dyn_scale = [&](int64_t k0, int64_t k1) {
      float a = 0;
      for (int64_t k = k0; k < k1; ++k) a = std::max(a, std::fabs(r[k]));
      return std::max(a, 1e-4f) / 448.0f;
    };
    switch (w.activation) {
      case Fp8Activation::kNone:
        for (int64_t k = 0; k < K; ++k) xd[m * K + k] = r[k];
        break;
      case Fp8Activation::kTensorStatic:
        quant_range(0, K, w.input_scale.ptr<float>()[0]);
        break;
      case Fp8Activation::kTokenDynamic:
        quant_range(0, K, dyn_scale(0, K));
        break;
      case Fp8Activation::kBlockDynamic:
        for (int64_t k0 = 0; k0 < K; k0 += w.block_k) {
          const int64_t k1 = std::min(K, k0 + w.block_k);
          quant_range(k0, k1, dyn_scale(k0, k1));
        }
        break;
    }
  }
  std::vector<double> out(static_cast<size_t>(M * N));
  const uint8_t* wq = w.w.ptr<uint8_t>();
  const float* s = w.scale.ptr<float>();
  const int64_t gk = w.granularity == Fp8Granularity::kBlock ? (K + w.block_k - 1) / w.block_k : 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      double acc = bias.defined() ? bias.ptr<float>()[n] : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        double sc = w.granularity == Fp8Granularity::kTensor ? s[0]
                    : w.granularity == Fp8Granularity::kChannel
                        ? s[n]
                        : s[(n / w.block_n) * gk + k / w.block_k];
        acc += xd[m * K + k] * (f8e4m3_to_f32(wq[n * K + k]) * sc);
      }
      out[m * N + n] = acc;
    }
  return out;
}

// Random e4m3 codes (finite, both signs), scales in [0.5, 2) · 2^-6.
Tensor random_f8(Shape shape, uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape), DType::kF8E4M3);
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint8_t c;
    do c = static_cast<uint8_t>(rng() & 0xff);
    while ((c & 0x7f) == 0x7f || (c & 0x78) >= 0x60);  // no NaN, |value| < 16 (keeps sums tame)
    t.ptr<uint8_t>()[i] = c;
  }
  return t;
}

struct Case {
  int64_t m, n, k;
  Fp8Granularity g;
  Fp8Activation a;
  int bn, bk;
  bool bias;
};

TEST(LinearFp8Cpu, MatchesDirectDequantisedProduct) {
  const Case cases[] = {
      {3, 70, 200, Fp8Granularity::kBlock, Fp8Activation::kBlockDynamic, 32, 64, true},
      {5, 257, 300, Fp8Granularity::kBlock, Fp8Activation::kBlockDynamic, 128, 128, false},
      {2, 33, 90, Fp8Granularity::kBlock, Fp8Activation::kTokenDynamic, 16, 48, true},
      {4, 50, 77, Fp8Granularity::kChannel, Fp8Activation::kTokenDynamic, 0, 0, true},
      {6, 41, 64, Fp8Granularity::kTensor, Fp8Activation::kTensorStatic, 0, 0, false},
      {3, 29, 100, Fp8Granularity::kChannel, Fp8Activation::kNone, 0, 0, true},
      {1, 64, 256, Fp8Granularity::kBlock, Fp8Activation::kNone, 32, 32, false},
  };
  uint64_t seed = 17;
  for (const Case& c : cases) {
    Fp8Weight w;
    w.w = random_f8({c.n, c.k}, seed++);
    w.granularity = c.g;
    w.activation = c.a;
    if (c.g == Fp8Granularity::kBlock) {
      w.block_n = c.bn;
      w.block_k = c.bk;
      w.scale = test::random_cpu({(c.n + c.bn - 1) / c.bn, (c.k + c.bk - 1) / c.bk}, DType::kF32,
                                 seed++, 0.01f, 0.03f);
    } else {
      w.scale = test::random_cpu({c.g == Fp8Granularity::kChannel ? c.n : 1}, DType::kF32, seed++,
                                 0.01f, 0.03f);
    }
    if (c.a == Fp8Activation::kTensorStatic) w.input_scale = f32({1}, {0.004f});  // saturates some
    Tensor x = test::random_cpu({c.m, c.k}, DType::kF32, seed++, -2.0f, 2.0f);
    // One all-zero block-group row part and one zero row: the amax floor.
    for (int64_t k = 0; k < std::min<int64_t>(c.k, 40); ++k) x.ptr<float>()[k] = 0.0f;
    Tensor bias = c.bias ? test::random_cpu({c.n}, DType::kF32, seed++) : Tensor();
    Tensor out = Tensor::empty({c.m, c.n}, DType::kF32);
    kernels::linear_fp8(out, x, w, bias);
    const std::vector<double> ref = direct(x, w, bias);
    double num = 0, den = 0;
    for (int64_t i = 0; i < out.numel(); ++i) {
      const double d = out.ptr<float>()[i] - ref[i];
      ASSERT_TRUE(std::isfinite(out.ptr<float>()[i]));
      num += d * d;
      den += ref[i] * ref[i];
    }
    // fp32 summation against double: measured 3.2e-8 to 1.5e-7 on these cases.
    std::cout << "  rel err " << std::sqrt(num / den) << "\n";
    EXPECT_LE(std::sqrt(num / den), 1e-6)
        << "M=" << c.m << " N=" << c.n << " K=" << c.k << " g=" << int(c.g) << " a=" << int(c.a);
  }
}

TEST(LinearFp8Cpu, RejectsBadScaleShape) {
  Fp8Weight w;
  w.w = random_f8({10, 20}, 1);
  w.scale = f32({1, 1}, {1.0f});  // wants [1, 1] for 128x128 blocks: fine; then a wrong one
  Tensor x = test::random_cpu({2, 20}, DType::kF32, 2);
  Tensor out = Tensor::empty({2, 10}, DType::kF32);
  kernels::linear_fp8(out, x, w);
  w.block_k = 8;  // 3 k blocks now
  EXPECT_THROW(kernels::linear_fp8(out, x, w), std::exception);
  w.block_k = 128;
  w.activation = Fp8Activation::kTensorStatic;  // no input_scale
  EXPECT_THROW(kernels::linear_fp8(out, x, w), std::exception);
}

// Activations quantised before the call (kernels::Fp8Input, what a fused RMSNorm or SiLU·mul
// writes): the codes and scales are the rule's (checked against the definition here, not the
// kernel's own quantisation), and the product on them is the product on the activations, bit for
// bit; a weight that quantises its input another way refuses them by name. The fused ops on the
// CPU write what the unfused op followed by quantize_fp8 writes.
TEST(LinearFp8Cpu, QuantisedInputsAreTheRuleAndComputeTheSameProduct) {
  struct QCase {
    int64_t m, n, k;
    Fp8Granularity g;
    Fp8Activation a;
    int bk;
  };
  const QCase cases[] = {
      {5, 70, 300, Fp8Granularity::kBlock, Fp8Activation::kBlockDynamic, 128},
      {3, 40, 96, Fp8Granularity::kBlock, Fp8Activation::kBlockDynamic, 32},
      {6, 50, 77, Fp8Granularity::kChannel, Fp8Activation::kTokenDynamic, 0},
      {2, 41, 64, Fp8Granularity::kTensor, Fp8Activation::kTensorStatic, 0},
  };
  uint64_t seed = 300;
  for (const QCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "M=" << c.m << " K=" << c.k << " a=" << int(c.a));
    Fp8Weight w;
    w.w = random_f8({c.n, c.k}, seed++);
    w.granularity = c.g;
    w.activation = c.a;
    if (c.g == Fp8Granularity::kBlock) {
      w.block_n = 64;
      w.block_k = c.bk;
      w.scale = test::random_cpu({(c.n + 63) / 64, (c.k + c.bk - 1) / c.bk}, DType::kF32, seed++,
                                 0.01f, 0.03f);
    } else {
      w.scale = test::random_cpu({c.g == Fp8Granularity::kChannel ? c.n : 1}, DType::kF32, seed++,
                                 0.01f, 0.03f);
    }
    if (c.a == Fp8Activation::kTensorStatic) w.input_scale = f32({1}, {0.004f});
    Tensor x = test::random_cpu({c.m, c.k}, DType::kF32, seed++, -2.0f, 2.0f);
    for (int64_t k = 0; k < 40; ++k) x.ptr<float>()[k] = 0.0f;  // a zero group: the floor
    kernels::Fp8Input in;
    in.quant = kernels::Fp8Quant::of(w);
    in.codes = Tensor::empty({c.m, c.k}, DType::kF8E4M3);
    in.scales = Tensor::empty({kernels::fp8_input_scale_count(c.m, c.k, in.quant)}, DType::kF32);
    kernels::quantize_fp8(in, x);
    const int64_t group = c.a == Fp8Activation::kBlockDynamic ? c.bk : c.k,
                  G = (c.k + group - 1) / group, ld = (c.m + 3) / 4 * 4;
    int bad = 0;
    for (int64_t m = 0; m < c.m; ++m)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t k0 = g * group, k1 = std::min(c.k, k0 + group);
        float amax = 0.0f;
        for (int64_t k = k0; k < k1; ++k)
          amax = std::max(amax, std::fabs(x.ptr<float>()[m * c.k + k]));
        const float s =
            c.a == Fp8Activation::kTensorStatic ? 0.004f : std::max(amax, 1e-4f) / 448.0f;
        bad += in.scales.ptr<float>()[g * ld + m] != s;
        for (int64_t k = k0; k < k1; ++k)
          bad += in.codes.ptr<uint8_t>()[m * c.k + k] !=
                 f32_to_f8e4m3(x.ptr<float>()[m * c.k + k] / s);
      }
    EXPECT_EQ(bad, 0);
    Tensor a = Tensor::empty({c.m, c.n}, DType::kF32), b = Tensor::empty({c.m, c.n}, DType::kF32);
    kernels::linear_fp8(a, x, w);
    kernels::linear_fp8(b, in, w);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
    // Quantised for another product: refused.
    Fp8Weight other = w;
    other.activation = c.a == Fp8Activation::kTokenDynamic ? Fp8Activation::kTensorStatic
                                                           : Fp8Activation::kTokenDynamic;
    other.input_scale = f32({1}, {0.004f});
    try {
      kernels::linear_fp8(b, in, other);
      ADD_FAILURE() << "activations quantised for another product were taken";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("quantised for another product"), std::string::npos)
          << e.what();
    }
  }
  // The fused ops (the CPU's are the reference: the op, then the quantisation).
  const Tensor x = test::random_cpu({4, 256}, DType::kF32, 900, -2.0f, 2.0f);
  const Tensor h = test::random_cpu({4, 256}, DType::kF32, 901, -2.0f, 2.0f);
  const Tensor wn = test::random_cpu({256}, DType::kF32, 902, 0.5f, 1.5f);
  kernels::Fp8Quant q;
  q.block_k = 128;
  auto input = [&](int64_t m, int64_t k) {
    kernels::Fp8Input in;
    in.quant = q;
    in.codes = Tensor::empty({m, k}, DType::kF8E4M3);
    in.scales = Tensor::empty({kernels::fp8_input_scale_count(m, k, q)}, DType::kF32);
    return in;
  };
  Tensor res_a = h.clone(), res_b = h.clone(), y = Tensor::empty({4, 256}, DType::kF32);
  kernels::Fp8Input fa = input(4, 256), fb = input(4, 256);
  ASSERT_TRUE(kernels::rms_norm_fp8(fa, x, &res_a, wn, 1e-6f));
  kernels::rms_norm(y, x, &res_b, wn, 1e-6f);
  kernels::quantize_fp8(fb, y);
  EXPECT_EQ(std::memcmp(fa.codes.data(), fb.codes.data(), fa.codes.nbytes()), 0);
  EXPECT_EQ(std::memcmp(fa.scales.data(), fb.scales.data(), 2 * 4 * 4), 0);  // the [2, 4] grid
  EXPECT_EQ(std::memcmp(res_a.data(), res_b.data(), res_a.nbytes()), 0);
  Tensor act = Tensor::empty({4, 128}, DType::kF32);
  kernels::Fp8Input ga = input(4, 128), gb = input(4, 128);
  ASSERT_TRUE(kernels::glu_fp8(ga, x, kernels::Glu::silu()));
  kernels::glu(act, x, kernels::Glu::silu());
  kernels::quantize_fp8(gb, act);
  EXPECT_EQ(std::memcmp(ga.codes.data(), gb.codes.data(), ga.codes.nbytes()), 0);
  EXPECT_EQ(std::memcmp(ga.scales.data(), gb.scales.data(), 4 * 4), 0);
}

}  // namespace
}  // namespace atom
