// Hyper-connection kernels (kernels/hyper_connection.h): the collapse of the streams (a mix
// site's maps with the Sinkhorn normalisation, or the final head) one block per token, and the
// element-wise write-back and expansion.
#include "kernels/cuda/device_common.cuh"

namespace atom::kernels::cuda {

namespace {

constexpr int kHcThreads = 256;
constexpr int kHcMaxRows = (2 + kHcLaunchMaxStreams) * kHcLaunchMaxStreams;

__device__ __forceinline__ float sigmoid_f(float v) { return 1.0f / (1.0f + expf(-v)); }

__global__ void __launch_bounds__(kHcThreads) hc_collapse_kernel(HcLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float red[32];
  __shared__ float m[kHcMaxRows];
  __shared__ float w[kHcLaunchMaxStreams];
  __shared__ float cb[kHcLaunchMaxStreams * kHcLaunchMaxStreams];
  const int64_t t = blockIdx.x, D = a.dim;
  const int hc = a.hc, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n = hc * D;
  const float* x = a.x + t * n;
  if (a.fn) {
    const bool vec = (n & 3) == 0;
    float ss = 0.0f;
    if (vec) {
      for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) {
        const float4 v = reinterpret_cast<const float4*>(x)[i];
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      }
    } else {
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += x[i] * x[i];
    }
    ss = block_sum(ss, red);
    const float r = rsqrtf(ss / static_cast<float>(n) + a.norm_eps);
    // A warp per row of fn.
    for (int k = warp; k < a.rows; k += blockDim.x >> 5) {
      const float* f = a.fn + static_cast<int64_t>(k) * n;
      float acc = 0.0f;
      if (vec) {
        for (int64_t i = lane; i < n / 4; i += 32) {
          const float4 v = reinterpret_cast<const float4*>(x)[i];
          const float4 g = reinterpret_cast<const float4*>(f)[i];
          acc += v.x * g.x + v.y * g.y + v.z * g.z + v.w * g.w;
        }
      } else {
        for (int64_t i = lane; i < n; i += 32) acc += x[i] * f[i];
      }
      acc = warp_sum(acc);
      if (lane == 0) m[k] = acc * r;
    }
    __syncthreads();
    if (warp == 0) {
      const float s0 = a.scale[0], eps = a.hc_eps;
      for (int j = lane; j < hc; j += 32) w[j] = sigmoid_f(m[j] * s0 + a.base[j]) + eps;
      if (a.post) {
        const float s1 = a.scale[1], s2 = a.scale[2];
        for (int j = lane; j < hc; j += 32)
          a.post[t * hc + j] = 2.0f * sigmoid_f(m[hc + j] * s1 + a.base[hc + j]);
        // Each row's softmax (+ eps), then the Sinkhorn iterations: a lane per row or column,
        // summed in index order as the CPU reference does.
        for (int i = lane; i < hc; i += 32) {
          float* row = cb + i * hc;
          float mx = -INFINITY;
          for (int j = 0; j < hc; ++j) {
            row[j] = m[2 * hc + i * hc + j] * s2 + a.base[2 * hc + i * hc + j];
            mx = fmaxf(mx, row[j]);
          }
          float sum = 0.0f;
          for (int j = 0; j < hc; ++j) sum += (row[j] = expf(row[j] - mx));
          for (int j = 0; j < hc; ++j) row[j] = row[j] / sum + eps;
        }
        __syncwarp();
        for (int it = 0; it < a.sinkhorn_iters; ++it) {
          if (it > 0) {
            for (int i = lane; i < hc; i += 32) {
              float sum = 0.0f;
              for (int j = 0; j < hc; ++j) sum += cb[i * hc + j];
              for (int j = 0; j < hc; ++j) cb[i * hc + j] /= sum + eps;
            }
            __syncwarp();
          }
          for (int j = lane; j < hc; j += 32) {
            float sum = 0.0f;
            for (int i = 0; i < hc; ++i) sum += cb[i * hc + j];
            for (int i = 0; i < hc; ++i) cb[i * hc + j] /= sum + eps;
          }
          __syncwarp();
        }
        for (int e = lane; e < hc * hc; e += 32) a.comb[t * hc * hc + e] = cb[e];
      }
    }
  } else if (threadIdx.x < hc) {
    w[threadIdx.x] = 1.0f / static_cast<float>(hc);
  }
  __syncthreads();
  // The single-pass form: the site's own pre out, the collapse by the carried one.
  if (threadIdx.x < hc) {
    if (a.pre_out) a.pre_out[t * hc + threadIdx.x] = w[threadIdx.x];
    if (a.by) w[threadIdx.x] = a.by[t * hc + threadIdx.x];
  }
  if (a.by) __syncthreads();
  char* o = row_of(a.out, t);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < hc; ++j) acc += w[j] * x[j * D + d];
    store_elem(o, a.out.type, d, acc);
  }
}

// HC > 0: the stream count known at compile time (the old values in registers); 0: any count
// up to kHcLaunchMaxStreams.
template <int HC>
__global__ void hc_write_back_kernel(float* x, int64_t tokens, int hc_rt, int64_t D, Mat y,
                                     const float* post, const float* comb) {
  pdl_wait();
  pdl_launch_dependents();
  const int hc = HC > 0 ? HC : hc_rt;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < tokens * D;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, d = i % D;
    float* xt = x + t * hc * D + d;
    float old[HC > 0 ? HC : kHcLaunchMaxStreams];
#pragma unroll
    for (int j = 0; j < (HC > 0 ? HC : kHcLaunchMaxStreams); ++j)
      if (j < hc) old[j] = xt[j * D];
    const float yv = load_elem(row_of(y, t), y.type, d);
    const float* pt = post + t * hc;
    const float* cb = comb + t * hc * hc;
#pragma unroll
    for (int k = 0; k < (HC > 0 ? HC : kHcLaunchMaxStreams); ++k) {
      if (k >= hc) break;
      float acc = pt[k] * yv;
#pragma unroll
      for (int j = 0; j < (HC > 0 ? HC : kHcLaunchMaxStreams); ++j)
        if (j < hc) acc += cb[j * hc + k] * old[j];
      xt[k * D] = acc;
    }
  }
}

__global__ void hc_expand_kernel(float* x, int64_t tokens, int hc, int64_t D, Mat e) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < tokens * D;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, d = i % D;
    const float v = load_elem(row_of(e, t), e.type, d);
    for (int j = 0; j < hc; ++j) x[(t * hc + j) * D + d] = v;
  }
}

}  // namespace

void launch_hc_collapse(const HcLaunch& a, cudaStream_t s) {
  if (a.tokens == 0) return;
  launch(hc_collapse_kernel, static_cast<unsigned>(a.tokens), kHcThreads, 0, s, a);
}

void launch_hc_write_back(float* x, int64_t tokens, int hc, int64_t dim, Mat y, const float* post,
                          const float* comb, cudaStream_t s) {
  if (tokens == 0) return;
  const unsigned grid = grid_for(tokens * dim, 256);
  if (hc == 4)
    launch(hc_write_back_kernel<4>, grid, 256, 0, s, x, tokens, hc, dim, y, post, comb);
  else
    launch(hc_write_back_kernel<0>, grid, 256, 0, s, x, tokens, hc, dim, y, post, comb);
}

void launch_hc_expand(float* x, int64_t tokens, int hc, int64_t dim, Mat e, cudaStream_t s) {
  if (tokens == 0) return;
  launch(hc_expand_kernel, grid_for(tokens * dim, 256), 256, 0, s, x, tokens, hc, dim, e);
}

}  // namespace atom::kernels::cuda
