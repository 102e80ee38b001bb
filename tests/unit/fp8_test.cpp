// float8_e4m3fn conversions (core/half.h) against tables built here from the format's definition:
// every code decoded, and encoding as the nearest code (ties to an even mantissa) found by
// searching all finite codes, saturating at 448.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/half.h"

namespace atom {
namespace {

// The value of code b by the definition: sign, 4-bit exponent of bias 7, 3-bit mantissa,
// subnormals at exponent 0, no infinities, S.1111.111 NaN.
double e4m3_value(int b) {
  const int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return sign ? -mag : mag;
}

// The expected code for x: the finite code nearest to |x| (ties: even mantissa, i.e. even code),
// 448 for anything larger, NaN as 0x7f, the sign carried over (zero included).
int e4m3_expected(float x) {
  const int sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7f;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 448.0) return sign | 0x7e;
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7e; ++c) {
    const double d = std::fabs(a - e4m3_value(c));
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return sign | best;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(Fp8E4m3, EveryCodeDecodes) {
  for (int b = 0; b < 256; ++b) {
    const double want = e4m3_value(b);
    const float got = f8e4m3_to_f32(static_cast<uint8_t>(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << b;
      continue;
    }
    // Exact, sign of zero included.
    EXPECT_EQ(bits_of(got), bits_of(static_cast<float>(want))) << "code " << b << " want " << want;
  }
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7f)) && std::isnan(f8e4m3_to_f32(0xff)));
}

TEST(Fp8E4m3, EveryFiniteCodeRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    EXPECT_EQ(f32_to_f8e4m3(f8e4m3_to_f32(static_cast<uint8_t>(b))), b) << "code " << b;
  }
}

TEST(Fp8E4m3, RoundsToNearestEvenAndSaturates) {
  struct Case {
    float x;
    int code;
  };
  const Case cases[] = {
      {1.0f, 0x38},
      {1.0625f, 0x38},     // halfway 1 .. 1.125: even mantissa (1)
      {1.0625001f, 0x39},  // just above halfway
      {1.1875f, 0x3a},     // halfway 1.125 .. 1.25: even (1.25)
      {15.5f, 0x58},       // halfway 15 .. 16: carries into the exponent
      {-15.5f, 0xd8},
      {448.0f, 0x7e},
      {449.0f, 0x7e},  // saturates (no rounding up to NaN)
      {1e30f, 0x7e},
      {std::numeric_limits<float>::infinity(), 0x7e},
      {-std::numeric_limits<float>::infinity(), 0xfe},
      {std::ldexp(1.0f, -9), 0x01},   // smallest subnormal
      {std::ldexp(1.0f, -10), 0x00},  // halfway 0 .. 2^-9: even (0)
      {std::ldexp(1.5f, -10), 0x01},
      {std::ldexp(3.0f, -10), 0x02},   // halfway 1 .. 2 (x 2^-9): even (2)
      {std::ldexp(15.0f, -10), 0x08},  // halfway 7 x 2^-9 .. 2^-6: even (the smallest normal)
      {-std::ldexp(1.0f, -12), 0x80},  // rounds to zero, keeps the sign
      {0.0f, 0x00},
      {-0.0f, 0x80},
      {std::numeric_limits<float>::denorm_min(), 0x00},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(f32_to_f8e4m3(c.x), c.code) << c.x;
    EXPECT_EQ(e4m3_expected(c.x), c.code) << "table check of " << c.x;
  }
  EXPECT_EQ(f32_to_f8e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7f, 0x7f);
}

TEST(Fp8E4m3, EncodingMatchesTheNearestCodeEverywhere) {
  std::vector<float> xs;
  // Every midpoint between neighbouring codes and the floats either side of it.
  for (int c = 0; c < 0x7e; ++c) {
    const double lo = e4m3_value(c), hi = e4m3_value(c + 1);
    const float mid = static_cast<float>((lo + hi) / 2);
    xs.insert(xs.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f),
                         static_cast<float>(lo), static_cast<float>(hi)});
  }
  // Random magnitudes over the whole range, from far below the smallest subnormal to past 448.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> e(-16.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) xs.push_back(std::exp2(e(rng)));
  for (float x : xs) {
    for (float s : {x, -x}) ASSERT_EQ(f32_to_f8e4m3(s), e4m3_expected(s)) << s;
  }
}

}  // namespace
}  // namespace atom
