// The FP8 linear's activation quantisation, its general (SIMT) GEMM and its skinny decode GEMV.
// The wgmma GEMMs are in linear_fp8_gemm.cu and linear_fp8_gemm_tma.cu.
//
// Quantisation: a block per row (kBlock: per row and 8 groups). kBlock: each warp takes a group
// of `group` columns, amax over the group (warp max), scale = max(amax, 1e-4) / 448 and
// e4m3(x / scale) with the conversion instruction's round-to-nearest-even and saturation;
// kToken: the row's amax (block max); kStatic: the checkpoint's input_scale. Bit-exact with the
// CPU reference (same IEEE division, the same rounding: fp8.cuh).
// One pass (ATOM_FP8_QUANT_ONE_PASS, default on) where the shapes allow it: 16-bit activations
// read in 16-byte chunks (8 values), each value loaded once and kept in registers between the
// amax and the conversion. kBlock with 128-column groups: a half-warp a group, a chunk a lane,
// the group's amax by four shuffles, the (row, group) pairs spread flat over the grid; kToken and
// kStatic rows of up to 8,192 columns: a block a row, up to 4 chunks a thread (at 16,384 columns
// 8 chunks held 64 values a thread and lost to two passes at M >= 1,024 on the H100:
// docs/performance.md). Otherwise the two-pass kernel above (each value read twice, 8-byte
// loads).
//
// Skinny (M <= 4): two (or four) weight rows per block, its four warps' lanes each streaming
// 16-byte chunks (16 e4m3 weights) of every row, four chunks per row in flight; the activations
// (xq e4m3 codes, or BF16 for kNone) are read through L1. A chunk's 16 products are summed in
// fp32 and scaled once by its activation group's and weight block's scales (chunks never
// straddle a group: K, block_k and the group are multiples of 16).
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/linear_fp8_launch.h"
#include "kernels/cuda_tuning.h"

namespace atom::kernels::cuda {

namespace {

constexpr float kMax = 448.0f, kFloor = 1e-4f;  // kernels::kFp8Max, kFp8AmaxFloor

template <typename T, int V>
__device__ __forceinline__ void load_n(const T* p, float (&v)[V]) {
  if constexpr (V == 4) {
    load_vec<T, 4>(p, v);
  } else {
    v[0] = to_float<T>(p[0]);
  }
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(256)
    fp8_act_quant_kernel(Mat x, Fp8Act mode, const float* input_scale, Fp8Act8 a) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float scratch[32];
  constexpr int V = kVec ? 4 : 1;
  const int64_t m = blockIdx.x, K = x.cols;
  const T* row = static_cast<const T*>(x.data) + m * x.stride;
  uint8_t* q = a.xq + m * a.ldq;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  auto amax_of = [&](int64_t k0, int64_t k1, int first, int step) {
    float am = 0.0f;
    for (int64_t k = k0 + first * V; k < k1; k += step * V) {
      float v[V];
      load_n<T, V>(row + k, v);
#pragma unroll
      for (int i = 0; i < V; ++i) am = fmaxf(am, fabsf(v[i]));
    }
    return am;
  };
  auto quant = [&](int64_t k0, int64_t k1, int first, int step, float s) {
    for (int64_t k = k0 + first * V; k < k1; k += step * V) {
      float v[V];
      load_n<T, V>(row + k, v);
      if constexpr (kVec) {
        const uint32_t lo = float2_to_fp8x2(__fdiv_rn(v[0], s), __fdiv_rn(v[1], s));
        const uint32_t hi = float2_to_fp8x2(__fdiv_rn(v[2], s), __fdiv_rn(v[3], s));
        *reinterpret_cast<uint32_t*>(q + k) = lo | (hi << 16);
      } else {
        q[k] = static_cast<uint8_t>(float2_to_fp8x2(__fdiv_rn(v[0], s), 0.0f));
      }
    }
  };
  if (mode == Fp8Act::kBlock) {
    const int64_t G = (K + a.group - 1) / a.group;
    for (int64_t g = static_cast<int64_t>(blockIdx.y) * 8 + warp; g < G; g += 8 * gridDim.y) {
      const int64_t k0 = g * a.group, k1 = min(K, k0 + a.group);
      const float am = warp_max(amax_of(k0, k1, lane, 32));
      const float s = __fdiv_rn(fmaxf(am, kFloor), kMax);
      quant(k0, k1, lane, 32, s);
      if (lane == 0) a.sx[g * a.ld_sx + m] = s;
    }
  } else {
    float s;
    if (mode == Fp8Act::kStatic)
      s = *input_scale;
    else
      s = __fdiv_rn(fmaxf(block_max(amax_of(0, K, tid, 256), scratch), kFloor), kMax);
    quant(0, K, tid, 256, s);
    if (tid == 0) a.sx[m] = s;
  }
  if (blockIdx.y == 0)
    for (int64_t k = K + tid; k < a.ldq; k += 256) q[k] = 0;
}

// kBlock, 128-column groups, one pass: half-warp h of block b takes the (row, group) pair
// b * 16 + h (groups of a row consecutive); lane l of it the chunk at column 128 g + 8 l.
template <typename T>
__global__ void __launch_bounds__(256) fp8_act_quant_g128_kernel(Mat x, int64_t G, Fp8Act8 a) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t K = x.cols, item = static_cast<int64_t>(blockIdx.x) * 16 + (threadIdx.x >> 4);
  const int l = threadIdx.x & 15;
  const bool live = item < x.rows * G;
  const int64_t m = live ? item / G : 0, g = live ? item % G : 0, k = g * 128 + l * 8;
  const bool in = live && k < K;  // K % 8 == 0: a chunk is whole or absent
  float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (in) load_vec<T, 8>(static_cast<const T*>(x.data) + m * x.stride + k, v);
  float am = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) am = fmaxf(am, fabsf(v[i]));
    // Every lane takes part (dead pairs with zeros); offsets below 16 stay in the half-warp.
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
  const float s = __fdiv_rn(fmaxf(am, kFloor), kMax);
  uint8_t* q = a.xq + m * a.ldq;
  if (in) *reinterpret_cast<uint2*>(q + k) = quant8(v, s);
  if (live && l == 0) a.sx[g * a.ld_sx + m] = s;
  if (live && g == G - 1)  // the row's zero padding [K, ldq)
    for (int64_t c = K + l; c < a.ldq; c += 16) q[c] = 0;
}

// kToken / kStatic, one pass: a block a row, thread t's chunks at columns 8 (256 c + t).
template <typename T, int C>
__global__ void __launch_bounds__(256)
    fp8_act_quant_row_kernel(Mat x, Fp8Act mode, const float* input_scale, Fp8Act8 a) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float scratch[32];
  const int64_t m = blockIdx.x, K = x.cols;
  const T* row = static_cast<const T*>(x.data) + m * x.stride;
  const int tid = threadIdx.x;
  float v[C][8];
  float am = 0.0f;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int64_t k = (static_cast<int64_t>(c) * 256 + tid) * 8;
    if (k < K) {
      load_vec<T, 8>(row + k, v[c]);
#pragma unroll
      for (int i = 0; i < 8; ++i) am = fmaxf(am, fabsf(v[c][i]));
    }
  }
  const float s = mode == Fp8Act::kStatic ? *input_scale
                                          : __fdiv_rn(fmaxf(block_max(am, scratch), kFloor), kMax);
  uint8_t* q = a.xq + m * a.ldq;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int64_t k = (static_cast<int64_t>(c) * 256 + tid) * 8;
    if (k < K) *reinterpret_cast<uint2*>(q + k) = quant8(v[c], s);
  }
  if (tid == 0) a.sx[m] = s;
  for (int64_t k = K + tid; k < a.ldq; k += 256) q[k] = 0;
}

template <typename T>
void quant_typed(Mat x, Fp8Act mode, const float* input_scale, const Fp8Act8& a, cudaStream_t s) {
  // One pass: 16-bit values in whole, 16-byte aligned chunks, 8-byte aligned code rows.
  if constexpr (sizeof(T) == 2) {
    const bool wide = cuda_tuning().fp8_quant_one_pass && x.cols % 8 == 0 && x.stride % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && a.ldq % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(a.xq) % 8 == 0;
    if (wide && mode == Fp8Act::kBlock && a.group == 128) {
      const int64_t G = (x.cols + 127) / 128, blocks = (x.rows * G + 15) / 16;
      launch(fp8_act_quant_g128_kernel<T>, dim3(static_cast<unsigned>(blocks)), 256, 0, s, x, G, a);
      return;
    }
    if (wide && mode != Fp8Act::kBlock && x.cols <= 8 * 256 * 4) {
      const dim3 grid(static_cast<unsigned>(x.rows));
      const int64_t chunks = (x.cols + 2047) / 2048;
      if (chunks <= 1)
        launch(fp8_act_quant_row_kernel<T, 1>, grid, 256, 0, s, x, mode, input_scale, a);
      else if (chunks <= 2)
        launch(fp8_act_quant_row_kernel<T, 2>, grid, 256, 0, s, x, mode, input_scale, a);
      else
        launch(fp8_act_quant_row_kernel<T, 4>, grid, 256, 0, s, x, mode, input_scale, a);
      return;
    }
  }
  const bool vec = x.cols % 4 == 0 && x.stride % 4 == 0 &&
                   (mode != Fp8Act::kBlock || a.group % 4 == 0) &&
                   (reinterpret_cast<uintptr_t>(x.data) % (4 * sizeof(T))) == 0;
  // kBlock: a block per 8 groups of a row (decode-sized M would leave most SMs idle otherwise).
  const int64_t groups = mode == Fp8Act::kBlock ? (x.cols + a.group - 1) / a.group : 8;
  const dim3 grid(static_cast<unsigned>(x.rows), static_cast<unsigned>((groups + 7) / 8));
  if (vec)
    launch(fp8_act_quant_kernel<T, true>, grid, 256, 0, s, x, mode, input_scale, a);
  else
    launch(fp8_act_quant_kernel<T, false>, grid, 256, 0, s, x, mode, input_scale, a);
}

// ---- the general GEMM: 64x64 output tiles, k steps of 32, each thread 4x4 outputs (rows
// ty + 16 i, columns tx + 16 j); both operands dequantised to fp32 as they are staged.
constexpr int kGT = 64, kGK = 32;

__device__ __forceinline__ float wscale(const Fp8GemmArgs& g, int64_t n, int64_t k) {
  switch (g.gran) {
    case Fp8Gran::kTensor:
      return g.sw[0];
    case Fp8Gran::kChannel:
      return g.sw[n];
    default:
      return g.sw[(n / g.bn) * ((g.k + g.bk - 1) / g.bk) + k / g.bk];
  }
}

__global__ void __launch_bounds__(256) fp8_gemm_general_kernel(Fp8GemmArgs g) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float As[kGK][kGT + 1], Bs[kGK][kGT + 1];
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kGT,
                n0 = static_cast<int64_t>(blockIdx.x) * kGT;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < g.k; k0 += kGK) {
#pragma unroll
    for (int p = 0; p < (kGT * kGK) / 256; ++p) {
      const int idx = tid + 256 * p, r = idx / kGK, kk = idx % kGK;
      const int64_t k = k0 + kk, m = m0 + r, n = n0 + r;
      float av = 0.0f, bv = 0.0f;
      if (m < g.m && k < g.k) {
        if (g.act == Fp8Act::kNone)
          av = load_elem(g.x.data, g.x.type, m * g.x.stride + k);
        else
          av = fp8_to_float(g.a.xq[m * g.a.ldq + k]) * g.a.sx[(k / g.a.group) * g.a.ld_sx + m];
      }
      if (n < g.n && k < g.k) bv = fp8_to_float(g.w[n * g.k + k]) * wscale(g, n, k);
      As[kk][r] = av;
      Bs[kk][r] = bv;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kGK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = As[kk][ty + 16 * i];
        b[i] = Bs[kk][tx + 16 * i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (m >= g.m || n >= g.n) continue;
      float v = acc[i][j];
      if (g.bias) v += load_elem(g.bias, g.bias_type, n);
      store_elem(g.out.data, g.out.type, m * g.out.stride + n, v);
    }
}

// ---- skinny
constexpr int kSkThreads = 128, kSkUnroll = 4;

// 16 e4m3 codes -> 16 floats.
__device__ __forceinline__ void fp8x16_to_float(const uint4& v, float (&f)[16]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = fp8x2_to_f16x2(w[i] & 0xffffu), hi = fp8x2_to_f16x2(w[i] >> 16);
    __half2 a, b;
    memcpy(&a, &lo, 4);
    memcpy(&b, &hi, 4);
    const float2 fa = __half22float2(a), fb = __half22float2(b);
    f[4 * i] = fa.x;
    f[4 * i + 1] = fa.y;
    f[4 * i + 2] = fb.x;
    f[4 * i + 3] = fb.y;
  }
}

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

template <typename TX, int M, bool kQuant, int kSkRows>
__global__ void __launch_bounds__(kSkThreads) fp8_skinny_kernel(Fp8GemmArgs g) {
  pdl_launch_dependents();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kSkRows;
  const int chunks = static_cast<int>(g.k / 16);
  const uint4* wrow[kSkRows];
  int64_t rown[kSkRows];
#pragma unroll
  for (int r = 0; r < kSkRows; ++r) {
    rown[r] = min(n0 + r, g.n - 1);
    wrow[r] = reinterpret_cast<const uint4*>(g.w + rown[r] * g.k);
  }
  // Weight scales: kBlock rows' scale rows, chunks per k block; activation chunks per group.
  const int gk = static_cast<int>((g.k + g.bk - 1) / g.bk);
  const unsigned ck_w = static_cast<unsigned>(g.bk / 16);
  const unsigned ck_a = kQuant ? static_cast<unsigned>(g.a.group / 16) : 1u;
  const float* swrow[kSkRows];
#pragma unroll
  for (int r = 0; r < kSkRows; ++r)
    swrow[r] = g.gran == Fp8Gran::kBlock     ? g.sw + (rown[r] / g.bn) * gk
               : g.gran == Fp8Gran::kChannel ? g.sw + rown[r]
                                             : g.sw;
  float acc[kSkRows][M];
#pragma unroll
  for (int r = 0; r < kSkRows; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  bool first = true;
  for (int c0 = tid; c0 < chunks; c0 += kSkThreads * kSkUnroll) {
    uint4 wv[kSkUnroll][kSkRows];
#pragma unroll
    for (int u = 0; u < kSkUnroll; ++u) {
      const int c = c0 + u * kSkThreads;
#pragma unroll
      for (int r = 0; r < kSkRows; ++r)
        wv[u][r] = c < chunks ? ld_stream(wrow[r] + c) : make_uint4(0, 0, 0, 0);
    }
    if (first) {  // the weights are not written by earlier kernels; x and its scales are
      pdl_wait();
      first = false;
    }
#pragma unroll
    for (int u = 0; u < kSkUnroll; ++u) {
      const int c = c0 + u * kSkThreads;
      if (c >= chunks) break;
      float xf[M][16], xs[M];
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if constexpr (kQuant) {
          const uint4 v = __ldg(reinterpret_cast<const uint4*>(g.a.xq + m * g.a.ldq) + c);
          fp8x16_to_float(v, xf[m]);
          xs[m] = g.a.sx[(static_cast<unsigned>(c) / ck_a) * g.a.ld_sx + m];
        } else {
          const TX* xr = static_cast<const TX*>(g.x.data) + m * g.x.stride + 16 * c;
          float lo[8], hi[8];
          load_vec<TX, 8>(xr, lo);
          load_vec<TX, 8>(xr + 8, hi);
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            xf[m][j] = lo[j];
            xf[m][8 + j] = hi[j];
          }
          xs[m] = 1.0f;
        }
      }
#pragma unroll
      for (int r = 0; r < kSkRows; ++r) {
        float wf[16];
        fp8x16_to_float(wv[u][r], wf);
        const float sw =
            g.gran == Fp8Gran::kBlock ? swrow[r][static_cast<unsigned>(c) / ck_w] : swrow[r][0];
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float part = 0.0f;
#pragma unroll
          for (int j = 0; j < 16; ++j) part = fmaf(wf[j], xf[m][j], part);
          acc[r][m] = fmaf(part, sw * xs[m], acc[r][m]);
        }
      }
    }
  }
  if (first) pdl_wait();
  __shared__ float red[kSkThreads / 32][kSkRows * M];
#pragma unroll
  for (int r = 0; r < kSkRows; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float v = warp_sum(acc[r][m]);
      if (lane == 0) red[warp][r * M + m] = v;
    }
  __syncthreads();
  if (tid < kSkRows * M) {
    const int r = tid / M, m = tid % M;
    const int64_t n = n0 + r;
    if (n < g.n) {
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < kSkThreads / 32; ++w) v += red[w][tid];
      if (g.bias) v += load_elem(g.bias, g.bias_type, n);
      store_elem(g.out.data, g.out.type, m * g.out.stride + n, v);
    }
  }
}

template <typename TX, bool kQuant, int kSkRows>
void skinny_rows(const Fp8GemmArgs& g, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((g.n + kSkRows - 1) / kSkRows));
  switch (g.m) {
    case 1:
      launch(fp8_skinny_kernel<TX, 1, kQuant, kSkRows>, grid, kSkThreads, 0, s, g);
      break;
    case 2:
      launch(fp8_skinny_kernel<TX, 2, kQuant, kSkRows>, grid, kSkThreads, 0, s, g);
      break;
    case 3:
      launch(fp8_skinny_kernel<TX, 3, kQuant, kSkRows>, grid, kSkThreads, 0, s, g);
      break;
    default:
      launch(fp8_skinny_kernel<TX, 4, kQuant, kSkRows>, grid, kSkThreads, 0, s, g);
      break;
  }
}

template <typename TX, bool kQuant>
void skinny_m(const Fp8GemmArgs& g, cudaStream_t s, int rows) {
  rows == 4 ? skinny_rows<TX, kQuant, 4>(g, s) : skinny_rows<TX, kQuant, 2>(g, s);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

void launch_fp8_act_quant(Mat x, Fp8Act mode, const float* input_scale, const Fp8Act8& a,
                          cudaStream_t s) {
  switch (x.type) {
    case Elem::kBF16:
      quant_typed<__nv_bfloat16>(x, mode, input_scale, a, s);
      break;
    case Elem::kF16:
      quant_typed<__half>(x, mode, input_scale, a, s);
      break;
    default:
      quant_typed<float>(x, mode, input_scale, a, s);
      break;
  }
}

void launch_fp8_gemm_general(const Fp8GemmArgs& g, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((g.n + kGT - 1) / kGT),
                  static_cast<unsigned>((g.m + kGT - 1) / kGT));
  launch(fp8_gemm_general_kernel, grid, 256, 0, s, g);
}

bool fp8_gemm_skinny_supported(const Fp8GemmArgs& g) {
  if (g.m < 1 || g.m > 4 || g.k % 16 != 0 || !aligned16(g.w)) return false;
  if (g.gran == Fp8Gran::kBlock && g.bk % 16 != 0) return false;
  if (g.act == Fp8Act::kNone)
    return g.x.type != Elem::kF32 && aligned16(g.x.data) && (g.m == 1 || g.x.stride % 8 == 0);
  return (g.act != Fp8Act::kBlock || g.a.group % 16 == 0) && aligned16(g.a.xq) && g.a.ldq % 16 == 0;
}

void launch_fp8_gemm_skinny(const Fp8GemmArgs& g, cudaStream_t s, int rows) {
  if (g.act != Fp8Act::kNone)
    skinny_m<__nv_bfloat16, true>(g, s, rows);
  else if (g.x.type == Elem::kBF16)
    skinny_m<__nv_bfloat16, false>(g, s, rows);
  else
    skinny_m<__half, false>(g, s, rows);
}

}  // namespace atom::kernels::cuda
