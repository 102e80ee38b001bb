// DeepSeek-V4.1's Engram gate on CUDA (kernels/engram.h): a block per (token, stream) sums the
// two mean squares and the gated product in one pass, then adds sigmoid(g) v into the stream.
#include "kernels/cuda/device_common.cuh"

namespace atom::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) engram_gate_kernel(EngramLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float red[32];
  __shared__ float gate;
  const int64_t t = blockIdx.x / a.hc;
  const int j = static_cast<int>(blockIdx.x % a.hc);
  const int64_t H = a.hidden;
  float* x = a.streams + (t * a.hc + j) * H;
  const char* row = row_of(a.kv, t);
  const float* kw = a.k_weight + j * H;
  const float* qw = a.q_weight + j * H;
  float sk = 0.0f, sx = 0.0f, p = 0.0f;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
    const float k = load_elem(row, a.kv.type, j * H + c), v = x[c];
    sk += k * k;
    sx += v * v;
    p += (k * kw[c]) * (v * qw[c]);
  }
  sk = block_sum(sk, red);
  sx = block_sum(sx, red);
  p = block_sum(p, red);
  if (threadIdx.x == 0) {
    const float ik = rsqrtf(sk / static_cast<float>(H) + a.eps);
    const float iq = rsqrtf(sx / static_cast<float>(H) + a.eps);
    float g = p * ik * iq * rsqrtf(static_cast<float>(H));
    const float m = sqrtf(fmaxf(fabsf(g), 1e-6f));
    g = g > 0.0f ? m : g < 0.0f ? -m : 0.0f;
    gate = 1.0f / (1.0f + expf(-g));
  }
  __syncthreads();
  const float s = gate;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x)
    x[c] += s * load_elem(row, a.kv.type, a.hc * H + c);
}

}  // namespace

void launch_engram_gate(const EngramLaunch& a, cudaStream_t s) {
  if (a.tokens == 0) return;
  launch(engram_gate_kernel, static_cast<unsigned>(a.tokens * a.hc), kThreads, 0, s, a);
}

}  // namespace atom::kernels::cuda
