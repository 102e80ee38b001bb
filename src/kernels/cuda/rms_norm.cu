// RMSNorm with the fused residual add, whole rows (one block reduction per row) or groups of
// `dim` columns (per-head q/k norm: one warp per group). Rows of up to 1,024 16-byte vectors
// (hidden 8,192 in BF16) keep one vector per thread in registers; wider or unaligned rows take
// two passes, the second re-reading the row from L1/L2, so any width works.
#include "kernels/cuda/device_common.cuh"

namespace atom::kernels::cuda {

namespace {

constexpr int kThreads = 256;

struct NormArgs {
  Mat out, x, res;
  bool has_res;
  const void* w;
  Elem w_type;
  int64_t dim;
  float eps;
  int kind;  // kernels::RmsNormKind
};

// Pass 1 over columns [c0, c1) with step: v = x (+ res, rounded and stored back); sum of squares.
template <typename T, int V>
__device__ __forceinline__ float norm_pass1(const NormArgs& a, int64_t r, int64_t c0, int64_t c1,
                                            int64_t step) {
  const T* x = reinterpret_cast<const T*>(row_of(a.x, r));
  T* res = a.has_res ? reinterpret_cast<T*>(row_of(a.res, r)) : nullptr;
  float ss = 0.0f;
  for (int64_t c = c0; c < c1; c += step) {
    float v[V];
    load_vec<T, V>(x + c, v);
    if (res) {
      float rv[V];
      load_vec<T, V>(res + c, rv);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = round_to<T>(v[j] + rv[j]);
      store_vec<T, V>(res + c, v);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) ss += v[j] * v[j];
  }
  return ss;
}

// Pass 2: out = rms_norm_apply (by kind); w index is c - g0.
template <typename T, int V>
__device__ __forceinline__ void norm_pass2(const NormArgs& a, int64_t r, int64_t g0, int64_t c0,
                                           int64_t c1, int64_t step, float inv) {
  const T* src = a.has_res ? reinterpret_cast<const T*>(row_of(a.res, r))
                           : reinterpret_cast<const T*>(row_of(a.x, r));
  T* out = reinterpret_cast<T*>(row_of(a.out, r));
  for (int64_t c = c0; c < c1; c += step) {
    float v[V];
    load_vec<T, V>(src + c, v);
#pragma unroll
    for (int j = 0; j < V; ++j)
      v[j] = rms_norm_apply<T>(v[j], inv, load_elem(a.w, a.w_type, c - g0 + j), a.kind);
    store_vec<T, V>(out + c, v);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads) rms_norm_row_kernel(NormArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x, width = a.x.cols;
  float ss = norm_pass1<T, V>(a, r, threadIdx.x * V, width, kThreads * V);
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(a.dim) + a.eps);
  norm_pass2<T, V>(a, r, 0, threadIdx.x * V, width, kThreads * V, inv);
}

// A row of at most 1,024 vectors: one vector per thread, held in registers between the passes,
// and the weight's vector loaded before waiting on the previous kernel (it never changes), so a
// decode-sized norm costs about one memory round trip plus the block reduction.
template <typename T, int V>
__global__ void __launch_bounds__(1024) rms_norm_row_reg_kernel(NormArgs a) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x, c = static_cast<int64_t>(threadIdx.x) * V;
  const bool active = c < a.x.cols;
  float w[V];
#pragma unroll
  for (int j = 0; j < V; ++j) w[j] = active ? load_elem(a.w, a.w_type, c + j) : 0.0f;
  pdl_wait();
  pdl_launch_dependents();
  float v[V];
  float ss = 0.0f;
  if (active) {
    load_vec<T, V>(reinterpret_cast<const T*>(row_of(a.x, r)) + c, v);
    if (a.has_res) {
      T* res = reinterpret_cast<T*>(row_of(a.res, r)) + c;
      float rv[V];
      load_vec<T, V>(res, rv);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = round_to<T>(v[j] + rv[j]);
      store_vec<T, V>(res, v);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) ss += v[j] * v[j];
  }
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(a.dim) + a.eps);
  if (!active) return;
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] = rms_norm_apply<T>(v[j], inv, w[j], a.kind);
  store_vec<T, V>(reinterpret_cast<T*>(row_of(a.out, r)) + c, v);
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads) rms_norm_group_kernel(NormArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t r = blockIdx.x, groups = a.x.cols / a.dim;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t g = warp; g < groups; g += kThreads / 32) {
    const int64_t g0 = g * a.dim;
    float ss = norm_pass1<T, V>(a, r, g0 + lane * V, g0 + a.dim, 32 * V);
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(a.dim) + a.eps);
    norm_pass2<T, V>(a, r, g0, g0 + lane * V, g0 + a.dim, 32 * V, inv);
  }
}

template <typename T, int V>
void launch_typed(const NormArgs& a, cudaStream_t s) {
  const unsigned rows = static_cast<unsigned>(a.x.rows);
  const int64_t vectors = (a.x.cols + V - 1) / V;
  if (a.dim == a.x.cols && V > 1 && vectors <= 1024)
    launch(rms_norm_row_reg_kernel<T, V>, rows, static_cast<unsigned>((vectors + 31) / 32 * 32), 0,
           s, a);
  else if (a.dim == a.x.cols)
    launch(rms_norm_row_kernel<T, V>, rows, kThreads, 0, s, a);
  else
    launch(rms_norm_group_kernel<T, V>, rows, kThreads, 0, s, a);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

void launch_rms_norm(Mat out, Mat x, const Mat* residual, const void* w, Elem w_type, int64_t dim,
                     float eps, int kind, cudaStream_t s) {
  if (x.rows == 0) return;
  NormArgs a{out, x, residual ? *residual : Mat{}, residual != nullptr, w, w_type, dim, eps, kind};
  const int v = x.type == Elem::kF32 ? 4 : 8;
  bool vec = dim % v == 0 && x.cols % v == 0 && x.stride % v == 0 && out.stride % v == 0 &&
             aligned16(x.data) && aligned16(out.data);
  if (residual) vec = vec && residual->stride % v == 0 && aligned16(residual->data);
  switch (x.type) {
    case Elem::kF32:
      vec ? launch_typed<float, 4>(a, s) : launch_typed<float, 1>(a, s);
      break;
    case Elem::kBF16:
      vec ? launch_typed<__nv_bfloat16, 8>(a, s) : launch_typed<__nv_bfloat16, 1>(a, s);
      break;
    case Elem::kF16:
      vec ? launch_typed<__half, 8>(a, s) : launch_typed<__half, 1>(a, s);
      break;
  }
}

}  // namespace atom::kernels::cuda
