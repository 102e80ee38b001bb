// Argmax and seeded sampling over logits rows: one block of 1024 threads per row. Thresholds
// (top-k, top-p) are found by a 32-step bitwise search over the order-preserving integer keys of
// the scaled logits, so no sort and no scratch memory are needed (docs/cuda.md).
#include "kernels/cuda/device_common.cuh"
#include "kernels/sampling_scheme.h"

namespace atom::kernels::cuda {

namespace {

constexpr int kThreads = 1024;

// Same layout as kernels::SamplingRow (sampling.h asserts its size).
struct Row {
  float temperature, top_p, min_p;
  int32_t top_k;
  uint64_t seed, step;
};

struct ArgBest {
  float v;
  int64_t i;
};

// Better: larger value, or equal value at a smaller index (i < 0: none).
__device__ __forceinline__ ArgBest arg_better(ArgBest a, ArgBest b) {
  if (b.i < 0) return a;
  if (a.i < 0) return b;
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
  return a;
}

__device__ ArgBest block_arg_best(ArgBest x, float* sv, int64_t* si) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ArgBest y{__shfl_xor_sync(0xffffffffu, x.v, o), __shfl_xor_sync(0xffffffffu, x.i, o)};
    x = arg_better(x, y);
  }
  __syncthreads();
  if (lane == 0) {
    sv[warp] = x.v;
    si[warp] = x.i;
  }
  __syncthreads();
  x = lane < (kThreads / 32) ? ArgBest{sv[lane], si[lane]} : ArgBest{-INFINITY, -1};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ArgBest y{__shfl_xor_sync(0xffffffffu, x.v, o), __shfl_xor_sync(0xffffffffu, x.i, o)};
    x = arg_better(x, y);
  }
  return x;
}

// Row argmax with the CPU's rule: the first index of the largest value; NaN never wins over a
// number (a leading NaN is returned as the CPU does).
__device__ int64_t row_argmax(const Mat& m, int64_t r, float* sv, int64_t* si) {
  const char* p = row_of(m, r);
  const float first = load_elem(p, m.type, 0);
  ArgBest best{-INFINITY, -1};
  if (m.type == Elem::kF32 && m.cols % 4 == 0 && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    // FP32 logits: four consecutive values per load; eight loads in flight per thread before any
    // is compared (arg_better is a total order, so the order of comparisons does not matter).
    const float4* p4 = reinterpret_cast<const float4*>(p);
    const int64_t n4 = m.cols / 4;
    auto take = [&](const float4& v, int64_t c) {  // the four values of word c
      const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (!isnan(e[j])) best = arg_better(best, ArgBest{e[j], 4 * c + j});
    };
    constexpr int kBatch = 8;
    int64_t c = threadIdx.x;
    for (; c + (kBatch - 1) * kThreads < n4; c += kBatch * kThreads) {
      float4 v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) v[u] = p4[c + u * kThreads];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) take(v[u], c + u * kThreads);
    }
    for (; c < n4; c += kThreads) take(p4[c], c);
  } else {
    for (int64_t c = threadIdx.x; c < m.cols; c += kThreads) {
      const float v = load_elem(p, m.type, c);
      if (!isnan(v)) best = arg_better(best, ArgBest{v, c});
    }
  }
  best = block_arg_best(best, sv, si);
  if (isnan(first) || best.i < 0) return 0;
  return best.i;
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(int32_t* ids, Mat logits) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  const int64_t r = blockIdx.x;
  const int64_t best = row_argmax(logits, r, sv, si);
  if (threadIdx.x == 0) ids[r] = static_cast<int32_t>(best);
}

__device__ __forceinline__ float scaled(const float* x, int64_t i, float t) {
  const float v = x[i];
  return isnan(v) ? -INFINITY : v / t;
}

__device__ float block_count_ge(const float* x, int64_t V, float t, uint32_t c, float* scratch) {
  float n = 0.0f;
  for (int64_t i = threadIdx.x; i < V; i += kThreads)
    n += sampling_key(scaled(x, i, t)) >= c ? 1.0f : 0.0f;
  return block_sum(n, scratch);
}

__device__ double block_sum_d(double v, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? scratch[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Mass (relative to exp(lmax)) of the tokens whose key is >= c.
__device__ double block_mass_ge(const float* x, int64_t V, float t, float lmax, uint32_t c,
                                double* scratch) {
  double m = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float l = scaled(x, i, t);
    if (sampling_key(l) >= c) m += static_cast<double>(expf(l - lmax));
  }
  return block_sum_d(m, scratch);
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(int32_t* ids, Mat logits, const Row* rows) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  __shared__ double sd[32];
  const int64_t r = blockIdx.x, V = logits.cols;
  const Row p = rows[r];
  if (!(p.temperature >= 1e-5f)) {  // kGreedyTemperature
    const int64_t best = row_argmax(logits, r, sv, si);
    if (threadIdx.x == 0) ids[r] = static_cast<int32_t>(best);
    return;
  }
  const float* x = reinterpret_cast<const float*>(row_of(logits, r));
  const float t = p.temperature;
  // Only min-p and top-p need the largest logit; plain temperature rows read the row once.
  float lmax = -INFINITY;
  if (p.min_p > 0.0f || p.top_p < 1.0f) {
    for (int64_t i = threadIdx.x; i < V; i += kThreads) lmax = fmaxf(lmax, scaled(x, i, t));
    lmax = block_max(lmax, sv);
  }
  uint32_t kmin = 0;
  if (p.min_p > 0.0f) kmin = max(kmin, sampling_key(lmax + logf(p.min_p)));
  if (p.top_k > 0 && p.top_k < V) {
    uint32_t k = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t c = k | (1u << bit);
      if (block_count_ge(x, V, t, c, sv) >= static_cast<float>(p.top_k)) k = c;
    }
    kmin = max(kmin, k);
  }
  if (p.top_p < 1.0f) {
    const double target = static_cast<double>(p.top_p) * block_mass_ge(x, V, t, lmax, kmin, sd);
    uint32_t k = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t c = k | (1u << bit);
      if (block_mass_ge(x, V, t, lmax, max(c, kmin), sd) >= target) k = c;
    }
    kmin = max(kmin, k);
  }
  const uint64_t stream = sampling_stream(p.seed, p.step);
  ArgBest best{-INFINITY, -1};
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float l = scaled(x, i, t);
    if (sampling_key(l) < kmin) continue;
    const float score = l + sampling_gumbel(stream, static_cast<uint64_t>(i));
    if (score > -INFINITY) best = arg_better(best, ArgBest{score, i});
  }
  best = block_arg_best(best, sv, si);
  if (best.i < 0) best.i = row_argmax(logits, r, sv, si);
  if (threadIdx.x == 0) ids[r] = static_cast<int32_t>(best.i);
}

// Grid (ceil(V / kMaskTile), R): each block clears the disallowed tokens of one tile of a row.
constexpr int kMaskThreads = 256, kMaskTile = 4096;

__global__ void mask_logits_kernel(Mat logits, const uint64_t* masks, int64_t words,
                                   int64_t num_masks, const int32_t* index) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t r = blockIdx.y;
  const int32_t k = index[r];
  if (k < 0 || k >= num_masks) return;
  float* x = reinterpret_cast<float*>(row_of(logits, r));
  const uint64_t* m = masks + static_cast<int64_t>(k) * words;
  const int64_t tile_end = (static_cast<int64_t>(blockIdx.x) + 1) * kMaskTile;
  const int64_t end = tile_end < logits.cols ? tile_end : logits.cols;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kMaskTile + threadIdx.x; t < end;
       t += kMaskThreads)
    if (!((m[t >> 6] >> (t & 63)) & 1)) x[t] = -INFINITY;
}

}  // namespace

void launch_mask_logits(Mat logits, const uint64_t* masks, int64_t words, int64_t num_masks,
                        const int32_t* index, cudaStream_t s) {
  if (logits.rows == 0 || logits.cols == 0) return;
  const dim3 grid(static_cast<unsigned>((logits.cols + kMaskTile - 1) / kMaskTile),
                  static_cast<unsigned>(logits.rows));
  launch(mask_logits_kernel, grid, kMaskThreads, 0, s, logits, masks, words, num_masks, index);
}

void launch_argmax(int32_t* ids, Mat logits, cudaStream_t s) {
  if (logits.rows == 0) return;
  launch(argmax_kernel, static_cast<unsigned>(logits.rows), kThreads, 0, s, ids, logits);
}

void launch_sample(int32_t* ids, Mat logits, const void* rows, cudaStream_t s) {
  if (logits.rows == 0) return;
  launch(sample_kernel, static_cast<unsigned>(logits.rows), kThreads, 0, s, ids, logits,
         static_cast<const Row*>(rows));
}

}  // namespace atom::kernels::cuda
