// Attention residuals (kernels/attn_res.h): one block per token; a warp per bank row for its
// score, then every thread mixes its channels.
#include "kernels/cuda/device_common.cuh"

namespace atom::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    attn_res_kernel(Mat out, const float* blocks, int64_t B, int64_t D, int n, const float* w,
                    float eps) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float p[kAttnResLaunchMaxRows];
  const int64_t t = blockIdx.x;
  const float* v = blocks + t * B * D;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int j = warp; j < n; j += warps) {
    const float* r = v + static_cast<int64_t>(j) * D;
    float ss = 0.0f, dot = 0.0f;
    for (int64_t c = lane; c < D; c += 32) {
      const float x = r[c];
      ss += x * x;
      dot += x * w[c];
    }
    ss = warp_sum(ss);
    dot = warp_sum(dot);
    if (lane == 0) p[j] = dot / sqrtf(ss / static_cast<float>(D) + eps);
  }
  __syncthreads();
  if (warp == 0) {  // softmax over the n scores
    float mx = -INFINITY;
    for (int j = lane; j < n; j += 32) mx = fmaxf(mx, p[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j < n; j += 32) sum += expf(p[j] - mx);
    sum = warp_sum(sum);
    __syncwarp();
    for (int j = lane; j < n; j += 32) p[j] = expf(p[j] - mx) / sum;
  }
  __syncthreads();
  void* o = row_of(out, t);
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) acc += p[j] * v[static_cast<int64_t>(j) * D + c];
    store_elem(o, out.type, c, acc);
  }
}

}  // namespace

void launch_attn_res(Mat out, const float* blocks, int64_t T, int64_t B, int64_t D, int n,
                     const float* w, float eps, cudaStream_t s) {
  if (T == 0) return;
  launch(attn_res_kernel, static_cast<unsigned>(T), kThreads, 0, s, out, blocks, B, D, n, w, eps);
}

}  // namespace atom::kernels::cuda
