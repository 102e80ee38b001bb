// Element access for the CPU reference kernels: float math on F32, BF16, F16 or (KV caches)
// F8E4M3 storage.
#pragma once

#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "core/tensor.h"

namespace atom::kernels::cpu {

// Below about this many elements of work a kernel runs on one thread: waking the OpenMP team
// costs more than the work.
constexpr int64_t kParallelMin = 1 << 15;

inline float load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF8E4M3:
      return f8e4m3_to_f32(static_cast<const uint8_t*>(p)[i]);
    default:
      ATOM_CHECK(false, "CPU kernel: unsupported dtype {}", dtype_name(t));
  }
}

inline void store(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
      break;
    case DType::kF8E4M3:
      static_cast<uint8_t*>(p)[i] = f32_to_f8e4m3(v);
      break;
    default:
      ATOM_CHECK(false, "CPU kernel: unsupported dtype {}", dtype_name(t));
  }
}

// v rounded to the precision of dtype t (identity for F32).
inline float round_to(DType t, float v) {
  if (t == DType::kF32) return v;
  uint16_t b;
  store(&b, t, 0, v);
  return load(&b, t, 0);
}

// Row r of a 2-D tensor whose last dimension is contiguous.
inline const char* row_ptr(const Tensor& t, int64_t r) {
  return static_cast<const char*>(t.data()) + r * t.stride(0) * (dtype_bits(t.dtype()) / 8);
}
inline char* row_ptr(Tensor& t, int64_t r) {
  return static_cast<char*>(t.data()) + r * t.stride(0) * (dtype_bits(t.dtype()) / 8);
}

// A 2-D tensor whose rows may be strided but whose columns are contiguous.
inline void check_rows(const char* op, const Tensor& t, const char* name) {
  ATOM_CHECK(t.dim() == 2 && (t.size(1) <= 1 || t.stride(1) == 1),
             "{}: {} must be 2-D with contiguous rows, got {}", op, name, t.str());
}

// Elements [off, off + n) of storage p of dtype t as floats in dst: the dtype's switch taken once
// for the span, not per element (F32 and BF16 in their own loops).
inline void load_span(const void* p, DType t, int64_t off, int64_t n, float* dst) {
  if (t == DType::kF32) {
    const float* f = static_cast<const float*>(p) + off;
    for (int64_t i = 0; i < n; ++i) dst[i] = f[i];
  } else if (t == DType::kBF16) {
    const uint16_t* b = static_cast<const uint16_t*>(p) + off;
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = load(p, t, off + i);
  }
}

// Converts row r of t to floats in dst[0, cols).
inline void row_to_float(const Tensor& t, int64_t r, float* dst) {
  load_span(row_ptr(t, r), t.dtype(), 0, t.size(1), dst);
}

inline void float_to_row(Tensor& t, int64_t r, const float* src) {
  char* p = row_ptr(t, r);
  const int64_t n = t.size(1);
  if (t.dtype() == DType::kF32) {
    float* f = reinterpret_cast<float*>(p);
    for (int64_t i = 0; i < n; ++i) f[i] = src[i];
  } else {
    for (int64_t i = 0; i < n; ++i) store(p, t.dtype(), i, src[i]);
  }
}

// Σ a[i] b[i] with eight partial sums, which lets the compiler vectorise without reassociating
// floats itself. Every CPU product (linear, the experts) uses this one, so equal inputs give
// bit-equal results whichever op computes them.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace atom::kernels::cpu
