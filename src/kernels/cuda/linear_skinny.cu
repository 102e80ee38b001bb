// out [M, N] = x [M, K] · w [N, K]ᵀ for the few rows of a decode step (M <= 4). Such a product
// only streams the weight once, so the kernel is built around the weight read: each warp owns
// kRows output columns, each lane reads 16 bytes of each of their weight rows per step, several
// steps in flight, and x (a few KB) is read through L1. K is split over a block's warps (more
// blocks, more loads in flight, a shorter tail), the first weight loads are issued before the PDL
// wait, and a [gate; up] weight can end in SiLU·mul. On the H200 it beats cuBLASLt's GEMV at
// M = 1 (docs/performance.md), where it is the default (CudaTuning::skinny_max_m,
// kernels/cuda_tuning.h).
#include <algorithm>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda_tuning.h"

namespace atom::kernels::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kRows = 2;  // weight rows per warp
// 16-byte weight loads per row in flight per lane. 8 measured slower on the H200 (batch-1 decode
// step 4.56-4.58 against 4.41-4.43 ms), as did the next step's loads issued early or an L2
// prefetch.
constexpr int kUnroll = kSkinnyEarlyLoadsAll;  // 4

struct SkinnyArgs {
  Mat out, x;
  const void* w;
  int64_t n, k;
  const void* bias;
  Elem bias_type;
  // > 0: w is [gate; up] with `pair` rows each, a warp's two rows are gate row j and up row j,
  // and out [M, pair] gets silu(g) * u with g and u rounded to T first (linear then silu_mul).
  int64_t pair;
  // rope.on: w is a [q; k; v] projection; a warp's two rows are the rotation pair (i, i + D/2) of
  // a q or k head, or two neighbouring v columns, and the epilogue rotates q and k (half-split,
  // as rope_kernel) and writes k and v into the cache slots, as the separate RoPE + cache write.
  SkinnyRope rope;
  int early_loads;  // of the kUnroll first loads per row, those issued before the PDL wait
};

// Output rows (weight rows) r0, r1 of column group g.
__device__ __forceinline__ void group_rows(const SkinnyArgs& a, int64_t g, int64_t& r0,
                                           int64_t& r1) {
  if (a.pair) {
    r0 = g;
    r1 = g + a.pair;
  } else if (a.rope.on) {
    const int64_t D = a.rope.head_dim, half = D / 2,
                  rot = static_cast<int64_t>(a.rope.q_heads + a.rope.kv_heads) * half;
    if (g < rot) {
      r0 = (g / half) * D + g % half;
      r1 = r0 + half;
    } else {
      r0 = 2 * rot + 2 * (g - rot);  // after the q and k columns
      r1 = r0 + 1;
    }
  } else {  // tail rows: computed, dropped
    r0 = min(2 * g, a.n - 1);
    r1 = min(2 * g + 1, a.n - 1);
  }
}

__host__ __device__ __forceinline__ int64_t num_groups(const SkinnyArgs& a) {
  return a.pair ? a.pair : a.rope.on ? a.n / 2 : (a.n + 1) / 2;
}

template <typename T>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = to_float<T>(e[i]);
}

// kSplit 1: each warp owns kRows output columns over all of K. kSplit kWarps: the block's warps
// share kRows columns, each over a quarter of K, summed through shared memory in a fixed order;
// four times the blocks, for products with few columns and a long K (o_proj, down_proj), whose
// unsplit grid leaves too few weight loads in flight per SM.
template <typename T, int M, int kSplit>
__global__ void __launch_bounds__(kWarps * 32) linear_skinny_kernel(SkinnyArgs a) {
  static_assert(kSplit == 1 || kSplit == kWarps, "split over the block's warps");
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t group = kSplit == 1 ? static_cast<int64_t>(blockIdx.x) * kWarps + warp
                                    : static_cast<int64_t>(blockIdx.x);
  static_assert(kRows == 2, "column groups are row pairs");
  if (group >= num_groups(a)) return;
  int64_t rows[kRows];
  group_rows(a, group, rows[0], rows[1]);
  // This warp's K range, in whole 8-element words.
  const int64_t kchunk = kSplit == 1 ? a.k : ((a.k + 8 * kSplit - 1) / (8 * kSplit)) * 8;
  const int64_t kbeg = kSplit == 1 ? 0 : warp * kchunk;
  const int64_t kend = kSplit == 1 ? a.k : min(a.k, kbeg + kchunk);
  const T* w[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) w[r] = static_cast<const T*>(a.w) + rows[r] * a.k;
  const T* x[M];
#pragma unroll
  for (int m = 0; m < M; ++m) x[m] = reinterpret_cast<const T*>(row_of(a.x, m));

  float acc[M][kRows];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[m][r] = 0.0f;

  constexpr int64_t kStep = 32 * 8;  // elements a warp covers per load
  uint4 wv[kUnroll][kRows];
  auto load_weights = [&](int64_t k0, int u0 = 0, int u1 = kUnroll) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (u < u0 || u >= u1) continue;
      const int64_t k = k0 + u * kStep;
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        wv[u][r] =
            k < kend ? __ldcs(reinterpret_cast<const uint4*>(w[r] + k)) : make_uint4(0, 0, 0, 0);
    }
  };
  // The weights do not depend on earlier kernels: the first loads are in flight while the
  // previous kernel drains (programmatic dependent launch); x is read only after the wait.
  // a.early_loads < kUnroll (after decode attention, which is latency-bound): the rest of them
  // right after the wait, so that fewer queue ahead of that kernel's memory accesses.
  int64_t k0 = kbeg + lane * 8;
  if (k0 < kend) load_weights(k0, 0, a.early_loads);
  // RoPE epilogue: lane m's token's rotation and cache slot, ready before the wait (the batch's
  // positions and slots were copied in before the step's first kernel; inv_freq is constant).
  float rope_c = 1.0f, rope_s = 0.0f;
  int64_t rope_slot = -1;
  if (a.rope.on && lane < M && (kSplit == 1 || warp == 0)) {
    const int64_t half = a.rope.head_dim / 2,
                  rot = static_cast<int64_t>(a.rope.q_heads + a.rope.kv_heads) * half;
    if (group < rot)
      rope_cos_sin(static_cast<float>(a.rope.positions[lane]), a.rope.inv_freq[group % half],
                   a.rope.scale, rope_c, rope_s);
    rope_slot = a.rope.slot_mapping[lane];
  }
  pdl_wait();
  if (k0 < kend && a.early_loads < kUnroll) load_weights(k0, a.early_loads, kUnroll);
  for (; k0 < kend;) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + u * kStep;
      if (k >= kend) break;
      float wf[kRows][8];
#pragma unroll
      for (int r = 0; r < kRows; ++r) unpack8<T>(wv[u][r], wf[r]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xf[8];
        unpack8<T>(__ldg(reinterpret_cast<const uint4*>(x[m] + k)), xf);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[m][r] = fmaf(xf[i], wf[r][i], acc[m][r]);
      }
    }
    k0 += kStep * kUnroll;
    if (k0 < kend) load_weights(k0);
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[m][r] = warp_sum(acc[m][r]);
  if constexpr (kSplit > 1) {
    __shared__ float part[kSplit][M][kRows];
    if (lane == 0)
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < kRows; ++r) part[warp][m][r] = acc[m][r];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float v = part[0][m][r];
#pragma unroll
        for (int w = 1; w < kSplit; ++w) v += part[w][m][r];
        acc[m][r] = v;
      }
  }
  if (a.bias)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[m][r] += load_elem(a.bias, a.bias_type, rows[r]);
  if (a.pair) {  // lane m writes output (m, group)
#pragma unroll
    for (int m = 0; m < M; ++m)
      if (lane == m)
        store_elem(row_of(a.out, m), a.out.type, group,
                   silu_times(round_to<T>(acc[m][0]), round_to<T>(acc[m][1])));
    return;
  }
  if (a.rope.on) {  // lane m: the pair of token m, rotated, then its cache slot
    const SkinnyRope& p = a.rope;
    const int64_t half = p.head_dim / 2, rot = static_cast<int64_t>(p.q_heads + p.kv_heads) * half;
    const int64_t width = static_cast<int64_t>(p.kv_heads) * p.head_dim;  // a cache slot's row
#pragma unroll
    for (int m = 0; m < M; ++m)
      if (lane == m) {
        float y1 = round_to<T>(acc[m][0]), y2 = round_to<T>(acc[m][1]);
        int64_t dst = -1;  // element of the k or v cache row this pair starts at
        if (group < rot) {
          const int64_t h = group / half, i = group % half;
          rope_rotate(y1, y2, rope_c, rope_s, y1, y2);  // x1, x2 are taken by value
          if (h >= p.q_heads) dst = (h - p.q_heads) * p.head_dim + i;
        } else {
          dst = rows[0] - 2 * rot;
        }
        char* o = row_of(a.out, m);
        store_elem(o, a.out.type, rows[0], y1);
        store_elem(o, a.out.type, rows[1], y2);
        const int64_t slot = dst >= 0 ? rope_slot : -1;
        if (slot >= 0 && slot < p.num_slots) {
          T* cache = static_cast<T*>(group < rot ? p.k_cache : p.v_cache) + slot * width + dst;
          cache[0] = from_float<T>(y1);
          cache[group < rot ? half : 1] = from_float<T>(y2);
        }
      }
    return;
  }
  // Lane m * kRows + r writes output (m, rows[r]).
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (lane == m * kRows + r && 2 * group + r < a.n)
        store_elem(row_of(a.out, m), a.out.type, rows[r], acc[m][r]);
}

template <typename T, int kSplit>
void launch_split(const SkinnyArgs& a, cudaStream_t s) {
  const int64_t groups = num_groups(a);
  const unsigned grid =
      static_cast<unsigned>(kSplit == 1 ? (groups + kWarps - 1) / kWarps : groups);
  switch (a.x.rows) {
    case 1:
      launch(linear_skinny_kernel<T, 1, kSplit>, grid, kWarps * 32, 0, s, a);
      break;
    case 2:
      launch(linear_skinny_kernel<T, 2, kSplit>, grid, kWarps * 32, 0, s, a);
      break;
    case 3:
      launch(linear_skinny_kernel<T, 3, kSplit>, grid, kWarps * 32, 0, s, a);
      break;
    default:
      launch(linear_skinny_kernel<T, 4, kSplit>, grid, kWarps * 32, 0, s, a);
      break;
  }
}

template <typename T>
void launch_typed(const SkinnyArgs& a, cudaStream_t s) {
  if (a.n < cuda_tuning().skinny_split_max_n && a.k >= 8 * 32 * kWarps)
    launch_split<T, kWarps>(a, s);
  else
    launch_split<T, 1>(a, s);
}

}  // namespace

void launch_linear_skinny(Mat out, Mat x, const void* w, int64_t n, int64_t k, const void* bias,
                          Elem bias_type, cudaStream_t s, bool silu_mul_pairs,
                          const SkinnyRope& rope, int early_loads) {
  if (x.rows == 0 || n == 0) return;
  const int early = std::clamp(early_loads, 0, kUnroll);
  SkinnyArgs a{out, x, w, n, k, bias, bias_type, silu_mul_pairs ? n / 2 : 0, rope, early};
  if (x.type == Elem::kBF16)
    launch_typed<__nv_bfloat16>(a, s);
  else
    launch_typed<__half>(a, s);
}

}  // namespace atom::kernels::cuda
