// Pieces shared by fused_moe.cu (the decode path, the counting sort, the combine and the
// launcher) and fused_moe_gemm.cu (the grouped GEMMs of larger batches).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/launch.h"

namespace atom::kernels::cuda::moe {

// The expert weights' storage, a template argument of the kernels: 16-bit (the activation type),
// MXFP4 (W4A16) or FP8 e4m3 with F32 block scales (W8A16).
inline constexpr int kQNone = 0, kQMx = 1, kQF8 = 2;

// Rows of a grouped-GEMM tile (64 or 128, MoeLaunch::gemm_tile_rows): each slot's rows are
// padded to a multiple of it in the sorted order, and every tile holds rows of one slot.
inline constexpr int kMinTileRows = 64, kMaxTileRows = 128;

// MXFP4 -> BF16: the 32 e2m1 codes of `packed` (16 bytes, two a byte, the low nibble first) times
// 2^(scale - 127), as 32 BF16 values in out[0..3] (8 each, in k order: out[u] word j holds
// values 8u + 2j and 8u + 2j + 1, bytes 4u + j of packed). Exact for every code and any scale
// whose products stay normal: a code's sign and 3 magnitude bits are placed into a BF16 as
// (e2m1 value) * 2^-126 (e2m1's exponent field becomes the low exponent bits, its subnormal
// 0.5 a BF16 subnormal), then multiplied by 2^126 and by the scale (both exact powers of two).
__device__ __forceinline__ uint32_t mxfp4_byte_to_bf16x2(uint32_t b) {
  return ((b & 0x7u) << 6) | ((b & 0x8u) << 12) | ((b & 0x70u) << 18) | ((b & 0x80u) << 24);
}
__device__ __forceinline__ __nv_bfloat162 bits_bf162(uint32_t v) {
  __nv_bfloat162 r;
  *reinterpret_cast<uint32_t*>(&r) = v;
  return r;
}
__device__ __forceinline__ uint32_t bf162_bits(__nv_bfloat162 v) {
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ void mxfp4_expand(const uint4& packed, uint32_t scale, uint4 (&out)[4]) {
  // Scales 1..128 (all that real weights use): one multiply by 2^126 * 2^(s - 127) = 2^(s - 1),
  // exponent field s + 126. Others: 2^126, then 2^(s - 127) (exponent field s; s = 0: 2^-127,
  // the subnormal 0x0040; 255: inf).
  scale &= 0xffu;
  const bool one = scale - 1u < 128u;
  const uint32_t sb = one ? (scale + 126u) << 7 : scale == 0 ? 0x0040u : scale << 7;
  const __nv_bfloat162 sc = bits_bf162(sb | (sb << 16));
  const __nv_bfloat162 up = bits_bf162(one ? 0x3F803F80u : 0x7E807E80u);  // 1 or 2^126
  const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    uint32_t o[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __nv_bfloat162 v = bits_bf162(mxfp4_byte_to_bf16x2(words[u] >> (8 * j)));
      o[j] = bf162_bits(one ? __hmul2(v, sc) : __hmul2(__hmul2(v, up), sc));
    }
    out[u] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

// FP8 -> BF16: the 32 e4m3 codes of lo (k 0-15) and hi (k 16-31) times `scale`, each product
// formed in fp32 and rounded once to BF16 (the value the loader writes when it dequantises an
// FP8 checkpoint weight at load), as 32 BF16 values in out[0..3] in k order (out[u] word j holds
// values 8u + 2j and 8u + 2j + 1).
__device__ __forceinline__ uint32_t fp8x2_scaled_bf16x2(uint32_t two, float scale) {
  const uint32_t h = fp8x2_to_f16x2(two);
  __half2 hv;
  memcpy(&hv, &h, 4);
  const float2 f = __half22float2(hv);
  return bf162_bits(__floats2bfloat162_rn(f.x * scale, f.y * scale));
}
__device__ __forceinline__ void fp8_expand(const uint4& lo, const uint4& hi, float scale,
                                           uint4 (&out)[4]) {
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
  for (int u = 0; u < 4; ++u)
    out[u] = make_uint4(fp8x2_scaled_bf16x2(w[2 * u] & 0xffffu, scale),
                        fp8x2_scaled_bf16x2(w[2 * u] >> 16, scale),
                        fp8x2_scaled_bf16x2(w[2 * u + 1] & 0xffffu, scale),
                        fp8x2_scaled_bf16x2(w[2 * u + 1] >> 16, scale));
}

// The F32 scale of weight row `row` at k of an FP8 expert whose scales are [rows / bn blocks,
// gk] (bk 0: one scale per row).
__device__ __forceinline__ int64_t fp8_scale_index(int64_t row, int64_t k, int bn, int bk,
                                                   int64_t gk) {
  return (row / bn) * gk + (bk ? k / bk : 0);
}

// The sorted order and tile table the counting sort writes (device pointers), and the operands
// of one grouped GEMM.
struct GemmArgs {
  const void* a = nullptr;  // w13: x [T, H] (rows a_stride apart); w2: act [P, I]
  int64_t a_stride = 0;
  const void* w =
      nullptr;  // w13 [S, 2I, H] or w2 [S, H, I] (MXFP4: U8 blocks, k halved; FP8: e4m3)
  // MXFP4: w13 [S, H/32, 2I] or w2 [S, I/32, H] U8; FP8: F32 [S, rows / fp8_bn, gk]; else null
  const void* scales = nullptr;
  int fp8_bn = 0, fp8_bk = 0;  // FP8 experts (fp8_bn > 0): rows and k (0: all) of a scale
  void* out = nullptr;         // w13: act [P, I]; w2: y [T * K, H] (unweighted expert outputs)
  const int* sorted_rows = nullptr;  // [P]: row t * K + j of each sorted position, -1 padding
  // [MT]; tile t holds sorted positions [t, t + 1) * tile_rows_cap
  const int* tile_expert = nullptr;
  const int* tile_rows = nullptr;  // [MT] rows in use (<= tile_rows_cap)
  const int* num_tiles = nullptr;  // [1]
  int64_t H = 0, I = 0;
  int K = 0;
  int max_tiles = 0;  // the table's capacity (grid bound)
  int tile_rows_cap = kMinTileRows;
  // GPT-OSS's experts (the kernels' extended epilogue runs when any of these is set):
  const void* bias = nullptr;  // w13: [S, 2I] added to gate | up; w2: [S, H] added to y; or null
  int act = 0;  // w13: kernels::MoeActivation (0 silu(gate) * up; 1, 2 the clamped forms)
  float alpha = 1.702f, limit = 7.0f;
};

// act = silu(gate) * up (or the clamped SwiGLU, after the bias) of each sorted row (persistent
// wgmma kernel, tile_rows_cap x 256 tiles).
void launch_moe_gemm_w13(const GemmArgs& g, Elem type, cudaStream_t s);
// y[row] = w2[e] * act (+ the bias) of each sorted row.
void launch_moe_gemm_w2(const GemmArgs& g, Elem type, cudaStream_t s);

}  // namespace atom::kernels::cuda::moe
