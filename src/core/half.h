// bf16, f16 and fp8 (e4m3fn) bit conversions (host and device).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ATOM_HD __host__ __device__ inline
#else
#define ATOM_HD inline
#endif

namespace atom {

ATOM_HD float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
ATOM_HD uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
    return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

ATOM_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

ATOM_HD uint16_t f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = u & 0x7fffffu;
  if (((u >> 23) & 0xff) == 0xff)
    return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;
  return static_cast<uint16_t>(half);
}

// float8_e4m3fn, the FP8 KV cache's format (torch.float8_e4m3fn, vLLM's "fp8_e4m3"): sign, 4-bit
// exponent (bias 7), 3-bit mantissa; no infinities, 0x7f and 0xff are NaN, the largest finite
// value is 448. Codes 0x01-0x07 are subnormal: m * 2^-9.
ATOM_HD float f8e4m3_to_f32(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu, mant = b & 0x7u;
  uint32_t u;
  if (exp == 0xfu && mant == 0x7u) {
    u = sign | 0x7fc00000u;
  } else if (exp == 0) {  // zero or subnormal: mant * 2^-9, exact in float
    float f = static_cast<float>(mant) * 0.001953125f;
    memcpy(&u, &f, 4);
    u |= sign;
  } else {
    u = sign | ((exp + 120u) << 23) | (mant << 20);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, saturating as vLLM's cache write (__NV_SATFINITE): a magnitude above
// 448 (infinity included) becomes 448; NaN becomes 0x7f with the input's sign.
ATOM_HD uint8_t f32_to_f8e4m3(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448
  if (a >= 0x3c800000u) {  // >= 2^-6: normal; carry out of the mantissa bumps the exponent
    const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
    return static_cast<uint8_t>(sign | ((r >> 20) - (120u << 3)));
  }
  // Below 2^-6: multiples of 2^-9. The value in units of 2^-9 is m * 2^(e - 150 + 9).
  const uint32_t e = a >> 23;
  if (e < 141 - 24) return sign;  // < 2^-11: rounds to zero
  const uint32_t m = (a & 0x7fffffu) | (e ? 0x800000u : 0u);
  const uint32_t shift = 141 - e;  // >= 21 since a < 2^-6 means e <= 120
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint8_t>(sign | q);
}

}  // namespace atom
