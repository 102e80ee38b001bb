// DeepSeek-V4.1's index plane on CUDA (kernels/index_plane.h): a block per key rotates it into
// shared memory, then quantises and stores it with the row functions the CPU runs.
#include "kernels/cuda/device_common.cuh"
#include "kernels/index_plane_rows.h"

namespace atom::kernels::cuda {

namespace {

constexpr int kThreads = 64;

__global__ void __launch_bounds__(kThreads) index_plane_store_kernel(IndexStoreLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float k[];  // [D]
  const int64_t e = blockIdx.x;
  int position = 0;
  const int64_t row = index_store_row(a.rows, a.positions, e, a.ratio, &position);
  if (row < 0) return;
  const int D = a.head_dim, R = a.rot_dim, half = R / 2;
  const float* src = a.keys + e * D;
  for (int d = threadIdx.x; d < D - R; d += blockDim.x) k[d] = src[d];
  const float pos = static_cast<float>(position);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float ang = pos * a.inv_freq[i];
    const float c = cosf(ang) * a.attention_factor, s = sinf(ang) * a.attention_factor;
    const float x0 = src[D - R + 2 * i], x1 = src[D - R + 2 * i + 1];
    k[D - R + 2 * i] = x0 * c - x1 * s;
    k[D - R + 2 * i + 1] = x1 * c + x0 * s;
  }
  __syncthreads();
  if (a.fp4) {
    for (int g = threadIdx.x; g < D / 32; g += blockDim.x)
      index_fp4_store(k + g * 32, 32, a.plane + row * (D / 2) + g * 16,
                      a.scales + row * (D / 32) + g);
  } else if (threadIdx.x == 0) {
    index_fp8_store(k, D, a.plane + row * (D + 4));
  }
}

}  // namespace

void launch_index_plane_store(const IndexStoreLaunch& a, cudaStream_t s) {
  if (a.num_keys == 0) return;
  launch(index_plane_store_kernel, static_cast<unsigned>(a.num_keys), kThreads,
         static_cast<size_t>(a.head_dim) * sizeof(float), s, a);
}

}  // namespace atom::kernels::cuda
