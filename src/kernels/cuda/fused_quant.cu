// An RMSNorm or a gated activation fused with the FP8 activation quantisation of the product
// after it (kernels::rms_norm_fp8, kernels::glu_fp8; the spec's *_QUANT_FUSION switches): the
// op's output values are rounded to its 16-bit type as its own store would round them, kept in
// registers, and quantised by linear_fp8.cu's rule (amax over a group, scale = max(amax, 1e-4) /
// 448, e4m3(v / scale) with the conversion's rounding) into the product's input, so neither the
// 16-bit output nor the quantisation's pass over it exists.
//
// RMSNorm: the layout of rms_norm.cu's register kernel (a block a row, a 16-byte vector a thread,
// blockDim the row's vectors rounded up to 32) so the sum of squares is reduced in the same order
// and the output is the same bit for bit; rows of up to 1,024 vectors (8,192 16-bit values).
// Gated activation: 1x128 groups and static scales by a half-warp a (row, 128 columns), spread
// over the grid (decode rows are few); per-token scales by a block a row, up to two vectors a
// thread (rows of up to 16,384 values).
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/linear_fp8_launch.h"

namespace atom::kernels::cuda {

namespace {

constexpr float kMax = 448.0f, kFloor = 1e-4f;  // kernels::kFp8Max, kFp8AmaxFloor

// Quantises the values a block holds for row m: thread t's chunk c is columns
// 8 (c * blockDim.x + t) .. + 8 (zeros past K). kBlock (groups of 128 columns: a half-warp's 16
// consecutive chunks), kToken (the row's amax over the block) or kStatic. Every thread of the
// block must call it.
template <int C>
__device__ __forceinline__ void quant_held(const float (&v)[C][8], int64_t m, int64_t K,
                                           Fp8Act mode, const float* input_scale, const Fp8Act8& a,
                                           float* scratch) {
  const int tid = threadIdx.x, nt = blockDim.x;
  uint8_t* q = a.xq + m * a.ldq;
  if (mode == Fp8Act::kBlock) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int64_t k = (static_cast<int64_t>(c) * nt + tid) * 8;
      float am = 0.0f;
      if (k < K)
#pragma unroll
        for (int i = 0; i < 8; ++i) am = fmaxf(am, fabsf(v[c][i]));
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
      const float s = __fdiv_rn(fmaxf(am, kFloor), kMax);
      if (k < K) {
        *reinterpret_cast<uint2*>(q + k) = quant8(v[c], s);
        if ((tid & 15) == 0) a.sx[(k / 128) * a.ld_sx + m] = s;
      }
    }
    return;
  }
  float s;
  if (mode == Fp8Act::kStatic) {
    s = *input_scale;
  } else {
    float am = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int i = 0; i < 8; ++i) am = fmaxf(am, fabsf(v[c][i]));  // zeros past K
    s = __fdiv_rn(fmaxf(block_max(am, scratch), kFloor), kMax);
  }
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int64_t k = (static_cast<int64_t>(c) * nt + tid) * 8;
    if (k < K) *reinterpret_cast<uint2*>(q + k) = quant8(v[c], s);
  }
  if (tid == 0) a.sx[m] = s;
}

struct NormFp8Args {
  Mat x, res;
  bool has_res;
  const void* w;
  Elem w_type;
  float eps;
  int kind;  // kernels::RmsNormKind
  Fp8Act mode;
  const float* input_scale;
  Fp8Act8 a;
};

template <typename T>
__global__ void __launch_bounds__(1024) rms_norm_fp8_kernel(NormFp8Args p) {
  __shared__ float scratch[32];
  const int64_t m = blockIdx.x, K = p.x.cols, c = static_cast<int64_t>(threadIdx.x) * 8;
  const bool active = c < K;
  float w[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) w[j] = active ? load_elem(p.w, p.w_type, c + j) : 0.0f;
  pdl_wait();
  pdl_launch_dependents();
  float v[1][8] = {{0, 0, 0, 0, 0, 0, 0, 0}};
  float ss = 0.0f;
  if (active) {
    load_vec<T, 8>(reinterpret_cast<const T*>(row_of(p.x, m)) + c, v[0]);
    if (p.has_res) {
      T* res = reinterpret_cast<T*>(row_of(p.res, m)) + c;
      float rv[8];
      load_vec<T, 8>(res, rv);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[0][j] = round_to<T>(v[0][j] + rv[j]);
      store_vec<T, 8>(res, v[0]);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[0][j] * v[0][j];
  }
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(K) + p.eps);
  if (active)
#pragma unroll
    for (int j = 0; j < 8; ++j)
      v[0][j] = round_to<T>(rms_norm_apply<T>(v[0][j], inv, w[j], p.kind));
  quant_held<1>(v, m, K, p.mode, p.input_scale, p.a, scratch);
}

struct GluFp8Args {
  Mat x;  // [M, 2 I]: gate | up
  int64_t I;
  int act;
  float alpha, limit;
  Fp8Act mode;
  const float* input_scale;
  Fp8Act8 a;
};

// The activation of 8 columns from k of row m, rounded to T as glu's store rounds it.
template <typename T>
__device__ __forceinline__ void glu8(const GluFp8Args& p, int64_t m, int64_t k, float (&o)[8]) {
  const T* xr = reinterpret_cast<const T*>(row_of(p.x, m));
  float g[8], u[8];
  load_vec<T, 8>(xr + k, g);
  load_vec<T, 8>(xr + p.I + k, u);
#pragma unroll
  for (int j = 0; j < 8; ++j)
    o[j] = round_to<T>(p.act == 0 ? silu_times(g[j], u[j])
                                  : moe_act_times(g[j], u[j], p.act, p.alpha, p.limit));
}

// kBlock (groups of 128) and kStatic: half-warp h of block b takes the (row, 128 columns) pair
// b * 16 + h; lane l the chunk at column 128 g + 8 l.
template <typename T>
__global__ void __launch_bounds__(256) glu_fp8_flat_kernel(GluFp8Args p, int64_t G) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t item = static_cast<int64_t>(blockIdx.x) * 16 + (threadIdx.x >> 4);
  const int l = threadIdx.x & 15;
  const bool live = item < p.x.rows * G;
  const int64_t m = live ? item / G : 0, g = live ? item % G : 0, k = g * 128 + l * 8;
  const bool in = live && k < p.I;  // I % 8 == 0: a chunk is whole or absent
  float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (in) glu8<T>(p, m, k, v);
  float s;
  if (p.mode == Fp8Act::kStatic) {
    s = *p.input_scale;
  } else {
    float am = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) am = fmaxf(am, fabsf(v[i]));
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
    s = __fdiv_rn(fmaxf(am, kFloor), kMax);
  }
  if (in) *reinterpret_cast<uint2*>(p.a.xq + m * p.a.ldq + k) = quant8(v, s);
  if (live && l == 0 && (p.mode == Fp8Act::kBlock || g == 0))
    p.a.sx[(p.mode == Fp8Act::kBlock ? g * p.a.ld_sx : 0) + m] = s;
}

// kToken: a block a row, C chunks a thread.
template <typename T, int C>
__global__ void __launch_bounds__(1024) glu_fp8_row_kernel(GluFp8Args p) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float scratch[32];
  const int64_t m = blockIdx.x;
  float v[C][8];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int64_t k = (static_cast<int64_t>(c) * blockDim.x + threadIdx.x) * 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) v[c][j] = 0.0f;
    if (k < p.I) glu8<T>(p, m, k, v[c]);
  }
  quant_held<C>(v, m, p.I, p.mode, p.input_scale, p.a, scratch);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// What both fused kernels need of the quantised side: whole 8-byte code chunks, 1x128 groups.
bool quant_side_ok(Fp8Act mode, const Fp8Act8& a, int64_t K) {
  return mode != Fp8Act::kNone && K % 8 == 0 && a.ldq % 8 == 0 &&
         reinterpret_cast<uintptr_t>(a.xq) % 8 == 0 && (mode != Fp8Act::kBlock || a.group == 128);
}

}  // namespace

bool launch_rms_norm_fp8(Mat x, const Mat* residual, const void* w, Elem w_type, float eps,
                         int kind, Fp8Act mode, const float* input_scale, const Fp8Act8& a,
                         cudaStream_t s) {
  const int64_t K = x.cols, vectors = K / 8;
  if (x.type == Elem::kF32 || !quant_side_ok(mode, a, K) || vectors > 1024 || x.stride % 8 != 0 ||
      !aligned16(x.data))
    return false;
  if (residual && (residual->stride % 8 != 0 || !aligned16(residual->data))) return false;
  if (x.rows == 0) return true;
  NormFp8Args p{
      x, residual ? *residual : Mat{}, residual != nullptr, w, w_type, eps, kind, mode, input_scale,
      a};
  const unsigned threads = static_cast<unsigned>((vectors + 31) / 32 * 32);
  if (x.type == Elem::kBF16)
    launch(rms_norm_fp8_kernel<__nv_bfloat16>, static_cast<unsigned>(x.rows), threads, 0, s, p);
  else
    launch(rms_norm_fp8_kernel<__half>, static_cast<unsigned>(x.rows), threads, 0, s, p);
  return true;
}

bool launch_glu_fp8(Mat x, int64_t I, int act, float alpha, float limit, Fp8Act mode,
                    const float* input_scale, const Fp8Act8& a, cudaStream_t s) {
  const int64_t vectors = I / 8;
  if (x.type == Elem::kF32 || !quant_side_ok(mode, a, I) || x.stride % 8 != 0 || !aligned16(x.data))
    return false;
  if (mode == Fp8Act::kToken && vectors > 2048) return false;
  if (x.rows == 0) return true;
  GluFp8Args p{x, I, act, alpha, limit, mode, input_scale, a};
  const bool bf16 = x.type == Elem::kBF16;
  if (mode != Fp8Act::kToken) {
    const int64_t G = (I + 127) / 128, blocks = (x.rows * G + 15) / 16;
    const dim3 grid(static_cast<unsigned>(blocks));
    if (bf16)
      launch(glu_fp8_flat_kernel<__nv_bfloat16>, grid, 256, 0, s, p, G);
    else
      launch(glu_fp8_flat_kernel<__half>, grid, 256, 0, s, p, G);
    return true;
  }
  const unsigned rows = static_cast<unsigned>(x.rows);
  if (vectors <= 1024) {
    const unsigned threads = static_cast<unsigned>((vectors + 31) / 32 * 32);
    if (bf16)
      launch(glu_fp8_row_kernel<__nv_bfloat16, 1>, rows, threads, 0, s, p);
    else
      launch(glu_fp8_row_kernel<__half, 1>, rows, threads, 0, s, p);
  } else {
    const unsigned threads = static_cast<unsigned>(((vectors + 1) / 2 + 31) / 32 * 32);
    if (bf16)
      launch(glu_fp8_row_kernel<__nv_bfloat16, 2>, rows, threads, 0, s, p);
    else
      launch(glu_fp8_row_kernel<__half, 2>, rows, threads, 0, s, p);
  }
  return true;
}

}  // namespace atom::kernels::cuda
