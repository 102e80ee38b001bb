// Per-head skinny products (kernels/linear.h: linear_heads): one warp per (head, output column)
// for all M <= 8 rows, 16-byte weight and activation loads, FP32 accumulation, one rounding.
// Multi-head latent attention's absorbed W_UK (q_nope -> latent) and W_UV (latent -> v) at
// decode, which are otherwise one small GEMM per head.
#include "kernels/cuda/device_common.cuh"

namespace atom::kernels::cuda {

namespace {

constexpr int kWarps = 4;

template <typename T>
__global__ void __launch_bounds__(32 * kWarps)
    linear_heads_kernel(Mat out, Mat x, const T* w, int heads, int64_t n, int64_t k, int64_t out_hs,
                        int64_t x_hs, int64_t w_hs) {
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const bool live = gw < heads * n;
  const int h = live ? static_cast<int>(gw / n) : 0;
  const int64_t col = live ? gw % n : 0;
  const T* wr = w + h * w_hs + col * k;
  // The weight row (not written by earlier kernels) before the PDL wait.
  constexpr int kMaxChunks = 4;  // k <= 32 * 4 * 8 = 1,024 held; longer rows loop
  float acc[kLinearHeadsMaxM];
#pragma unroll
  for (int m = 0; m < kLinearHeadsMaxM; ++m) acc[m] = 0.0f;
  const int64_t chunks = k / 8;
  float wv[kMaxChunks][8];
#pragma unroll
  for (int i = 0; i < kMaxChunks; ++i) {
    const int64_t c = lane + 32 * i;
    if (live && c < chunks) load_vec<T, 8>(wr + c * 8, wv[i]);
  }
  pdl_wait();
  pdl_launch_dependents();
  if (!live) return;
  for (int64_t c0 = 0; c0 < chunks; c0 += 32 * kMaxChunks) {
#pragma unroll
    for (int i = 0; i < kMaxChunks; ++i) {
      const int64_t c = c0 + lane + 32 * i;
      if (c >= chunks) continue;
      if (c0 > 0) load_vec<T, 8>(wr + c * 8, wv[i]);
#pragma unroll
      for (int m = 0; m < kLinearHeadsMaxM; ++m) {
        if (m >= x.rows) break;
        float xv[8];
        load_vec<T, 8>(reinterpret_cast<const T*>(row_of(x, m)) + h * x_hs + c * 8, xv);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[m] = fmaf(xv[e], wv[i][e], acc[m]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kLinearHeadsMaxM; ++m) {
    if (m >= x.rows) break;
    const float v = warp_sum(acc[m]);
    if (lane == 0) reinterpret_cast<T*>(row_of(out, m))[h * out_hs + col] = from_float<T>(v);
  }
}

}  // namespace

void launch_linear_heads(Mat out, Mat x, const void* w, int heads, int64_t n, int64_t k,
                         int64_t out_hs, int64_t x_hs, int64_t w_hs, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>((heads * n + kWarps - 1) / kWarps);
  if (x.type == Elem::kBF16)
    launch(linear_heads_kernel<__nv_bfloat16>, blocks, 32 * kWarps, 0, s, out, x,
           static_cast<const __nv_bfloat16*>(w), heads, n, k, out_hs, x_hs, w_hs);
  else
    launch(linear_heads_kernel<__half>, blocks, 32 * kWarps, 0, s, out, x,
           static_cast<const __half*>(w), heads, n, k, out_hs, x_hs, w_hs);
}

}  // namespace atom::kernels::cuda
