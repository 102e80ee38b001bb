// out [M, N] = x [M, K] · w [N, K]ᵀ for the few rows of a decode step (M <= 4). Such a product
// only streams the weight once, so the kernel is built around the weight read: each warp owns
// kRows output columns, each lane reads 16 bytes of each of their weight rows per step, several
// steps in flight, and x (a few KB) is read through L1. On the H200 it matches cuBLASLt's GEMV
// within a few percent (docs/performance.md), so it is off by default (linear_config.h).
#include "kernels/cuda/device_common.cuh"

namespace atom::kernels::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kRows = 2;    // weight rows per warp
constexpr int kUnroll = 4;  // 16-byte weight loads per row in flight per lane (8, with the next
                            // step's loads issued early, or an L2 prefetch, measured slower)

struct SkinnyArgs {
  Mat out, x;
  const void* w;
  int64_t n, k;
  const void* bias;
  Elem bias_type;
};

template <typename T>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = to_float<T>(e[i]);
}

template <typename T, int M>
__global__ void __launch_bounds__(kWarps * 32) linear_skinny_kernel(SkinnyArgs a) {
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * kRows;
  if (n0 >= a.n) return;
  const T* w[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    w[r] = static_cast<const T*>(a.w) + min(n0 + r, a.n - 1) * a.k;  // tail rows: computed, dropped
  const T* x[M];
#pragma unroll
  for (int m = 0; m < M; ++m) x[m] = reinterpret_cast<const T*>(row_of(a.x, m));

  float acc[M][kRows];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[m][r] = 0.0f;

  constexpr int64_t kStep = 32 * 8;  // elements a warp covers per load
  pdl_wait();
  for (int64_t k0 = lane * 8; k0 < a.k; k0 += kStep * kUnroll) {
    uint4 wv[kUnroll][kRows];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + u * kStep;
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        wv[u][r] =
            k < a.k ? __ldcs(reinterpret_cast<const uint4*>(w[r] + k)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + u * kStep;
      if (k >= a.k) break;
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
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[m][r] = warp_sum(acc[m][r]);
      // Lane m * kRows + r writes output (m, n0 + r).
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (lane == m * kRows + r && n0 + r < a.n) {
        float v = acc[m][r];
        if (a.bias) v += load_elem(a.bias, a.bias_type, n0 + r);
        store_elem(row_of(a.out, m), a.out.type, n0 + r, v);
      }
    }
}

template <typename T>
void launch_typed(const SkinnyArgs& a, cudaStream_t s) {
  const int64_t warps = (a.n + kRows - 1) / kRows;
  const unsigned grid = static_cast<unsigned>((warps + kWarps - 1) / kWarps);
  switch (a.x.rows) {
    case 1:
      launch(linear_skinny_kernel<T, 1>, grid, kWarps * 32, 0, s, a);
      break;
    case 2:
      launch(linear_skinny_kernel<T, 2>, grid, kWarps * 32, 0, s, a);
      break;
    case 3:
      launch(linear_skinny_kernel<T, 3>, grid, kWarps * 32, 0, s, a);
      break;
    default:
      launch(linear_skinny_kernel<T, 4>, grid, kWarps * 32, 0, s, a);
      break;
  }
}

}  // namespace

void launch_linear_skinny(Mat out, Mat x, const void* w, int64_t n, int64_t k, const void* bias,
                          Elem bias_type, cudaStream_t s) {
  if (x.rows == 0 || n == 0) return;
  SkinnyArgs a{out, x, w, n, k, bias, bias_type};
  if (x.type == Elem::kBF16)
    launch_typed<__nv_bfloat16>(a, s);
  else
    launch_typed<__half>(a, s);
}

}  // namespace atom::kernels::cuda
