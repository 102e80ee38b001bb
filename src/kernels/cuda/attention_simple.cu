// Attention without tensor cores: one warp per (token, query head), FP32 math, any element type
// and any head_dim up to 256. It serves what the flash kernel does not (FP32 activations, small
// or odd head sizes, unaligned rows) and is a second, independent implementation for tests.
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/fp8.cuh"

namespace atom::kernels::cuda {

namespace {

constexpr int kMaxPerLane = 8;  // head_dim <= 256

// Element i of a cache of T, or of e4m3 codes.
template <typename T>
__device__ __forceinline__ float cache_at(const void* c, bool fp8, int64_t i) {
  return fp8 ? fp8_to_float(static_cast<const uint8_t*>(c)[i])
             : to_float<T>(static_cast<const T*>(c)[i]);
}

template <typename T>
__global__ void attention_simple_kernel(AttnLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t wid = static_cast<int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (wid >= a.num_tokens * a.num_heads) return;
  const int64_t t = wid / a.num_heads;
  const int h = static_cast<int>(wid % a.num_heads);
  // The sequence holding token t: the last s with query_start[s] <= t (empty sequences skipped).
  int lo = 0, hi = a.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.query_start[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int s = lo;
  const int q0 = a.query_start[s], qlen = a.query_start[s + 1] - q0, L = a.context_lens[s];
  const int qpos = a.window < 0 ? L - 1 : L - qlen + static_cast<int>(t - q0);  // < 0: non-causal
  const int kvh = h / (a.num_heads / a.num_kv_heads);
  const int first = a.window > 0 ? max(0, qpos - a.window + 1) : 0;
  const int D = a.head_dim;
  const T* q = static_cast<const T*>(a.q) + t * a.q_stride + static_cast<int64_t>(h) * D;
  float qv[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int d = lane + 32 * j;
    qv[j] = d < D ? to_float<T>(q[d]) : 0.0f;
    acc[j] = 0.0f;
  }
  // As the CPU reference: each cached value times its scale (1 unless the cache is FP8).
  const float ks = a.kv_fp8 ? a.k_scale : 1.0f, vs = a.kv_fp8 ? a.v_scale : 1.0f;
  const int32_t* pages = a.page_indices + a.page_indptr[s];
  float m = -INFINITY, l = 0.0f;
  for (int key = first; key <= qpos; ++key) {
    const int64_t page = pages[key / a.block_size];
    const int64_t base = ((page * a.block_size + key % a.block_size) * a.num_kv_heads + kvh) * D;
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int d = lane + 32 * j;
      if (d < D) dot += qv[j] * (cache_at<T>(a.k_cache, a.kv_fp8, base + d) * ks);
    }
    dot = warp_sum(dot);
    float sc = dot * a.scale;
    if (a.softcap > 0.0f) sc = a.softcap * tanhf(sc / a.softcap);
    const float mn = fmaxf(m, sc);
    const float alpha = expf(m - mn);
    const float p = expf(sc - mn);
    l = l * alpha + p;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int d = lane + 32 * j;
      acc[j] =
          acc[j] * alpha + (d < D ? p * (cache_at<T>(a.v_cache, a.kv_fp8, base + d) * vs) : 0.0f);
    }
    m = mn;
  }
  if (a.sinks) {
    const float sink = a.sinks[h];
    const float mf = fmaxf(m, sink);
    const float alpha = expf(m - mf);
    l = l * alpha + expf(sink - mf);
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) acc[j] *= alpha;
  }
  T* out = static_cast<T*>(a.out) + t * a.out_stride + static_cast<int64_t>(h) * D;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int d = lane + 32 * j;
    if (d < D) out[d] = from_float<T>(acc[j] / l);
  }
}

}  // namespace

void launch_attention_simple(const AttnLaunch& a, cudaStream_t s) {
  const int64_t warps = a.num_tokens * a.num_heads;
  if (warps == 0) return;
  const unsigned grid = static_cast<unsigned>((warps + 3) / 4);
  switch (a.type) {
    case Elem::kF32:
      launch(attention_simple_kernel<float>, grid, 128, 0, s, a);
      break;
    case Elem::kBF16:
      launch(attention_simple_kernel<__nv_bfloat16>, grid, 128, 0, s, a);
      break;
    case Elem::kF16:
      launch(attention_simple_kernel<__half>, grid, 128, 0, s, a);
      break;
  }
}

}  // namespace atom::kernels::cuda
