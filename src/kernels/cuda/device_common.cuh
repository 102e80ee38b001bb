// Device-side helpers shared by atom's .cu files: element conversion, row addressing, reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/launch.h"

namespace atom::kernels::cuda {

__device__ __forceinline__ float load_elem(const void* p, Elem t, int64_t i) {
  switch (t) {
    case Elem::kF32:
      return static_cast<const float*>(p)[i];
    case Elem::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default:
      return __half2float(static_cast<const __half*>(p)[i]);
  }
}

__device__ __forceinline__ void store_elem(void* p, Elem t, int64_t i, float v) {
  switch (t) {
    case Elem::kF32:
      static_cast<float*>(p)[i] = v;
      break;
    case Elem::kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    default:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
  }
}

// The sequence of row t (query_start ascending, S + 1 entries): the last s with qs[s] <= t.
__device__ __forceinline__ int seq_of_row(const int32_t* qs, int S, int t) {
  int lo = 0, hi = S - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (qs[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ char* row_of(const Mat& m, int64_t r) {
  return static_cast<char*>(m.data) + r * m.stride * (m.type == Elem::kF32 ? 4 : 2);
}

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __half2float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

// v rounded to T's precision.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_float<T>(from_float<T>(v));
}

// An RMS-normalised element (kernels::RmsNormKind), before the store's rounding: w * round(v * inv)
// (Llama), v * inv * (1 + w) (Gemma) or w * v * inv (GPT-OSS).
template <typename T>
__device__ __forceinline__ float rms_norm_apply(float v, float inv, float w, int kind) {
  const float n = v * inv;
  return kind == 1 ? n * (1.0f + w) : kind == 2 ? w * n : w * round_to<T>(n);
}

// V consecutive elements through one vector access (V * sizeof(T) is 4, 8 or 16 bytes, or V == 1).
template <typename T, int V>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = to_float<T>(*p);
  } else {
    constexpr int kBytes = V * sizeof(T);
    static_assert(kBytes == 16 || kBytes == 8 || kBytes == 4, "vector width");
    using Vec = typename std::conditional<
        kBytes == 16, uint4, typename std::conditional<kBytes == 8, uint2, uint32_t>::type>::type;
    Vec raw = *reinterpret_cast<const Vec*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = to_float<T>(e[i]);
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[V]) {
  if constexpr (V == 1) {
    *p = from_float<T>(in[0]);
  } else {
    constexpr int kBytes = V * sizeof(T);
    using Vec = typename std::conditional<kBytes == 16, uint4, uint2>::type;
    Vec raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < V; ++i) e[i] = from_float<T>(in[i]);
    *reinterpret_cast<Vec*>(p) = raw;
  }
}

// RoPE as the CPU reference computes it (the rope kernels and the skinny GEMV's fused epilogue):
// the angle pos * inv_freq in fp32, cos and sin times the attention factor, and the rotation of a
// pair with each product rounded separately.
__device__ __forceinline__ void rope_cos_sin(float pos, float inv_freq, float scale, float& c,
                                             float& s) {
  sincosf(pos * inv_freq, &s, &c);
  c *= scale;
  s *= scale;
}
__device__ __forceinline__ void rope_rotate(float x1, float x2, float c, float s, float& y1,
                                            float& y2) {
  y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
  y2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// silu(g) * u in fp32, as silu_mul and the skinny GEMV's fused epilogue compute it.
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// GPT-OSS's clamped SwiGLU in fp32, as the CPU's fused_moe computes it: g = min(gate, limit),
// u = clamp(up, -limit, limit), (u + 1) * g * sigmoid(alpha * g) (NaN passes through as there).
__device__ __forceinline__ float swiglu_oai_times(float gate, float up, float alpha, float limit) {
  const float g = limit < gate ? limit : gate;
  const float u = up < -limit ? -limit : (limit < up ? limit : up);
  return (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
}

// The experts' activation by kernels::MoeActivation: 0 silu(g) * u; 1 GPT-OSS's clamped SwiGLU;
// 2 silu(min(g, limit)) * clamp(u, -limit, limit) (DeepSeek-V4, GLM-5.3); 3 Kimi-K3's SiTU with
// beta = alpha and linear_beta = limit (0: up unchanged): beta tanh(g / beta) sigmoid(g) times
// up or linear_beta tanh(up / linear_beta); as the CPU computes them (kernels::glu_value).
__device__ __forceinline__ float moe_act_times(float gate, float up, int act, float alpha,
                                               float limit) {
  if (act == 1) return swiglu_oai_times(gate, up, alpha, limit);
  if (act == 3) {
    const float sg = alpha * tanhf(gate / alpha) / (1.0f + expf(-gate));
    return sg * (limit > 0.0f ? limit * tanhf(up / limit) : up);
  }
  if (act == 2) {
    const float g = limit < gate ? limit : gate;
    const float u = up < -limit ? -limit : (limit < up ? limit : up);
    return silu_times(g, u);
  }
  return silu_times(gate, up);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < nwarps ? scratch[lane] : 0.0f;
  return warp_sum(r);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < nwarps ? scratch[lane] : -INFINITY;
  return warp_max(r);
}

// Programmatic dependent launch (PDL): atom's kernels are launched so that the next kernel's
// blocks may start while the previous one drains (launch latency and ramp-up overlap; in a decode
// step most kernels are short). Every kernel calls pdl_wait() before it reads anything an earlier
// kernel wrote, and pdl_launch_dependents() once all its blocks have started (a dependent grid
// launches only after every block of this one triggered or exited). ATOM_PDL=0 turns it off.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

inline bool pdl_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("ATOM_PDL");
    return !(e && (std::strcmp(e, "0") == 0 || std::strcmp(e, "false") == 0 ||
                   std::strcmp(e, "off") == 0));
  }();
  return on;
}

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when enabled.
template <typename... Params, typename... Args>
inline void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

inline unsigned grid_for(int64_t n, int threads, int64_t cap = 132 * 16) {
  int64_t b = (n + threads - 1) / threads;
  if (b > cap) b = cap;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

// Lets `kernel` launch with `bytes` of dynamic shared memory on the current device. The attribute
// belongs to one device, so each device a kernel runs on (each tensor-parallel rank) needs it
// once; `done` is the caller's record of which devices have it (one bit each).
template <typename Kernel>
void max_dynamic_smem_once(std::atomic<uint64_t>& done, Kernel kernel, int bytes) {
  int device = 0;
  cudaGetDevice(&device);
  const uint64_t bit = uint64_t{1} << (device & 63);
  if (done.load(std::memory_order_acquire) & bit) return;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  done.fetch_or(bit, std::memory_order_release);
}

}  // namespace atom::kernels::cuda
