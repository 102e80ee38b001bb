// DeepSeek-V4.1's index plane rows (kernels/index_plane.h): the formats' arithmetic, the same
// code on the host and the device (ATOM_HD; this header includes nothing the device compiler
// cannot take).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/half.h"

namespace atom::kernels {

namespace index_plane {

// 2^e as a float, exactly, for e in [-149, 127] (subnormal below -126).
ATOM_HD float pow2f(int e) {
  uint32_t u = e >= -126 ? static_cast<uint32_t>(e + 127) << 23 : 1u << (e + 149);
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// ceil(log2(v)) for a positive normal double v.
ATOM_HD int ceil_log2(double v) {
  uint64_t u;
  memcpy(&u, &v, 8);
  const int e = static_cast<int>((u >> 52) & 0x7ffu) - 1023;
  return (u & ((uint64_t{1} << 52) - 1)) ? e + 1 : e;
}

// E2M1 code of x (already scaled), nearest, ties to the even code, saturating at 6.
ATOM_HD uint8_t e2m1_code(float x) {
  const float v[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float a = fminf(fabsf(x), 6.0f);
  uint8_t best = 0;
  for (uint8_t c = 1; c < 8; ++c) {
    const float dc = fabsf(a - v[c]), db = fabsf(a - v[best]);
    if (dc < db || (dc == db && (c % 2) == 0)) best = c;
  }
  uint32_t bits;
  memcpy(&bits, &x, 4);
  return static_cast<uint8_t>(best | ((bits >> 31) && best ? 8u : 0u));
}

ATOM_HD float e2m1_value(uint8_t c) {
  const float v[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (c & 8u) ? -v[c & 7u] : v[c & 7u];
}

// The E8M0 exponent byte of a group of 32 (2^ceil(log2(amax / 6))).
ATOM_HD uint8_t fp4_group_scale(const float* x) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const double lo = 6.0 * 1.1754943508222875e-38;  // 6 * 2^-126
  const double v = (static_cast<double>(amax) > lo ? static_cast<double>(amax) : lo) / 6.0;
  int e = ceil_log2(v);
  e = e < -127 ? -127 : e > 127 ? 127 : e;
  return static_cast<uint8_t>(e + 127);
}

}  // namespace index_plane

inline int64_t index_fp8_row_bytes(int64_t d) { return d + 4; }

ATOM_HD void index_fp8_store(const float* k, int64_t d, uint8_t* row) {
  float amax = 0;
  for (int64_t i = 0; i < d; ++i) amax = fmaxf(amax, fabsf(k[i]));
  const float raw = fmaxf(amax, 1e-4f) / 448.0f;  // in F32, as the writer computes it
  const float scale = index_plane::pow2f(index_plane::ceil_log2(static_cast<double>(raw)));
  const float inv = 1.0f / scale;
  for (int64_t i = 0; i < d; ++i) row[i] = f32_to_f8e4m3(fminf(fmaxf(k[i] * inv, -448.0f), 448.0f));
  memcpy(row + d, &scale, 4);
}

ATOM_HD void index_fp8_load(const uint8_t* row, int64_t d, float* out) {
  float scale;
  memcpy(&scale, row + d, 4);
  for (int64_t i = 0; i < d; ++i) out[i] = f8e4m3_to_f32(row[i]) * scale;
}

ATOM_HD void index_fp4_store(const float* k, int64_t d, uint8_t* values, uint8_t* scales) {
  for (int64_t g = 0; g < d / 32; ++g) {
    const float* x = k + g * 32;
    scales[g] = index_plane::fp4_group_scale(x);
    const float inv = index_plane::pow2f(127 - static_cast<int>(scales[g]));
    for (int i = 0; i < 32; i += 2)
      values[g * 16 + i / 2] = static_cast<uint8_t>(index_plane::e2m1_code(x[i] * inv) |
                                                    (index_plane::e2m1_code(x[i + 1] * inv) << 4));
  }
}

ATOM_HD void index_fp4_load(const uint8_t* values, const uint8_t* scales, int64_t d, float* out) {
  for (int64_t i = 0; i < d; ++i) {
    const uint8_t b = values[i / 2];
    const float s = index_plane::pow2f(static_cast<int>(scales[i / 32]) - 127);
    out[i] = index_plane::e2m1_value(i % 2 ? static_cast<uint8_t>(b >> 4)
                                           : static_cast<uint8_t>(b & 15u)) *
             s;
  }
}

// The index query as the scorers round it, in place (one (token, head) row of d).
ATOM_HD void index_fp8_round_query(float* q, int64_t d) {
  float amax = 0;
  for (int64_t i = 0; i < d; ++i) amax = fmaxf(amax, fabsf(q[i]));
  if (amax == 0) return;
  const float scale = amax / 448.0f;
  for (int64_t i = 0; i < d; ++i) q[i] = f8e4m3_to_f32(f32_to_f8e4m3(q[i] / scale)) * scale;
}

ATOM_HD void index_fp4_round_query(float* q, int64_t d) {
  for (int64_t g = 0; g < d / 32; ++g) {
    uint8_t v[16], s;
    index_fp4_store(q + g * 32, 32, v, &s);
    index_fp4_load(v, &s, 32, q + g * 32);
  }
}

// The row and rotary position of key e (-1: not stored) at slot rows[e] and position
// positions[e] in rows of `ratio` positions, on every backend (kernels/index_plane.h).
ATOM_HD int64_t index_store_row(const int32_t* rows, const int32_t* positions, int64_t e, int ratio,
                                int* position) {
  const int32_t slot = rows[e], p = positions[e];
  if (slot < 0 || (p + 1) % ratio != 0) return -1;
  *position = p + 1 - ratio;
  return slot / ratio;
}

}  // namespace atom::kernels
