// FP8 (float8_e4m3fn) conversions on the device for the FP8 KV cache, through Hopper's conversion
// instructions. Bit-exact with core/half.h's f8e4m3_to_f32 / f32_to_f8e4m3: decoding is exact,
// encoding rounds to nearest even and saturates at +-448 (vLLM's __NV_SATFINITE).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace atom::kernels::cuda {

// Two e4m3 codes (the low byte of `two` first) -> f16x2 (the low half first); exact.
__device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint32_t two) {
  uint32_t r;
  const uint16_t in = static_cast<uint16_t>(two);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(in));
  return r;
}

// f16x2 -> bf16x2; exact for every e4m3 value.
__device__ __forceinline__ uint32_t f16x2_to_bf16x2(uint32_t h) {
  __half2 v;
  memcpy(&v, &h, 4);
  const float2 f = __half22float2(v);
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  uint32_t r;
  memcpy(&r, &b, 4);
  return r;
}

// Two e4m3 codes -> two 16-bit values of T (__half or __nv_bfloat16), packed as mma operands are.
template <typename T>
__device__ __forceinline__ uint32_t fp8x2_to(uint32_t two) {
  if constexpr (std::is_same<T, __half>::value)
    return fp8x2_to_f16x2(two);
  else
    return f16x2_to_bf16x2(fp8x2_to_f16x2(two));
}

__device__ __forceinline__ float fp8_to_float(uint8_t b) {
  const uint32_t h = fp8x2_to_f16x2(b);
  __half v;
  const uint16_t lo = static_cast<uint16_t>(h);
  memcpy(&v, &lo, 2);
  return __half2float(v);
}

// (lo, hi) -> two e4m3 codes, lo in the low byte.
__device__ __forceinline__ uint16_t float2_to_fp8x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// Eight e4m3 codes of v / s (IEEE division, as the CPU's activation quantisation), in the order
// of v.
__device__ __forceinline__ uint2 quant8(const float (&v)[8], float s) {
  uint2 r;
  r.x = float2_to_fp8x2(__fdiv_rn(v[0], s), __fdiv_rn(v[1], s)) |
        (float2_to_fp8x2(__fdiv_rn(v[2], s), __fdiv_rn(v[3], s)) << 16);
  r.y = float2_to_fp8x2(__fdiv_rn(v[4], s), __fdiv_rn(v[5], s)) |
        (float2_to_fp8x2(__fdiv_rn(v[6], s), __fdiv_rn(v[7], s)) << 16);
  return r;
}

}  // namespace atom::kernels::cuda
