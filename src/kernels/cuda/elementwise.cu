// Small memory-bound kernels: add, cast, add_bias, gather_rows, embedding, glu, fill_uniform.
// Most read and write by run-time element type (a uniform branch); silu_mul, which moves the
// most bytes in prefill, has a 16-byte vector path.
#include <algorithm>

#include "core/half.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch_moe_quant.h"
#include "kernels/rng.h"

namespace atom::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void add_kernel(Mat out, Mat a, Mat b) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t n = out.rows * out.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / out.cols, c = i % out.cols;
    store_elem(row_of(out, r), out.type, c,
               load_elem(row_of(a, r), a.type, c) + load_elem(row_of(b, r), b.type, c));
  }
}

__global__ void add_gated_kernel(Mat out, Mat a, Mat b, Mat gate) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t n = out.rows * out.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / out.cols, c = i % out.cols;
    const float g = 1.0f / (1.0f + expf(-load_elem(row_of(gate, r), gate.type, 0)));
    store_elem(row_of(out, r), out.type, c,
               load_elem(row_of(a, r), a.type, c) + g * load_elem(row_of(b, r), b.type, c));
  }
}

__global__ void cast_kernel(Mat out, Mat x) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t n = out.rows * out.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / out.cols, c = i % out.cols;
    store_elem(row_of(out, r), out.type, c, load_elem(row_of(x, r), x.type, c));
  }
}

__global__ void add_bias_kernel(Mat out, const void* bias, Elem bias_type) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t n = out.rows * out.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / out.cols, c = i % out.cols;
    char* o = row_of(out, r);
    store_elem(o, out.type, c, load_elem(o, out.type, c) + load_elem(bias, bias_type, c));
  }
}

// One block per output row, copying elements of `esize` bytes (2 or 4).
template <typename W>
__global__ void gather_rows_kernel(Mat out, Mat x, const int32_t* idx) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t r = blockIdx.x;
  const int64_t src = idx[r];
  if (src < 0 || src >= x.rows) return;
  const W* s = reinterpret_cast<const W*>(row_of(x, src));
  W* d = reinterpret_cast<W*>(row_of(out, r));
  for (int64_t c = threadIdx.x; c < out.cols; c += blockDim.x) d[c] = s[c];
}

__global__ void embedding_kernel(Mat out, const int32_t* ids, const void* table, Elem table_type,
                                 int64_t table_rows, int64_t vocab_start) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const int64_t r = static_cast<int64_t>(ids[t]) - vocab_start;
  char* o = row_of(out, t);
  const bool in_shard = r >= 0 && r < table_rows;
  for (int64_t h = threadIdx.x; h < out.cols; h += blockDim.x)
    store_elem(o, out.type, h, in_shard ? load_elem(table, table_type, r * out.cols + h) : 0.0f);
}

// The same when the table has out's type and rows are whole 16-byte words: one word per thread
// per step (a decode step's single row in one or two round trips instead of one per element).
__global__ void embedding_vec_kernel(Mat out, const int32_t* ids, const uint4* table,
                                     int64_t table_rows, int64_t vocab_start, int64_t words) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const int64_t r = static_cast<int64_t>(ids[t]) - vocab_start;
  uint4* o = reinterpret_cast<uint4*>(row_of(out, t));
  const bool in_shard = r >= 0 && r < table_rows;
  for (int64_t w = threadIdx.x; w < words; w += blockDim.x)
    o[w] = in_shard ? table[r * words + w] : make_uint4(0, 0, 0, 0);
}

// V elements per thread per step; V > 1 needs I % V == 0 and 16-byte aligned rows.
template <typename T, int V>
__global__ void glu_kernel(Mat out, Mat x, int act, float alpha, float limit) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t I = out.cols, per_row = I / V, n = out.rows * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c = (i % per_row) * V;
    const T* xr = reinterpret_cast<const T*>(row_of(x, r));
    float g[V], u[V], o[V];
    load_vec<T, V>(xr + c, g);
    load_vec<T, V>(xr + I + c, u);
#pragma unroll
    for (int j = 0; j < V; ++j)
      o[j] = act == 0 ? silu_times(g[j], u[j]) : moe_act_times(g[j], u[j], act, alpha, limit);
    store_vec<T, V>(reinterpret_cast<T*>(row_of(out, r)) + c, o);
  }
}

__global__ void fill_uniform_kernel(void* data, Elem type, int64_t n, uint64_t seed, float lo,
                                    float span) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // No fused multiply-add: the CPU reference rounds the product and the sum separately.
    const float v = __fadd_rn(lo, __fmul_rn(span, random_uniform(seed, static_cast<uint64_t>(i))));
    store_elem(data, type, i, v);
  }
}

__global__ void fill_uniform_f8_kernel(uint8_t* data, int64_t n, uint64_t seed, float lo,
                                       float span) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    data[i] = f32_to_f8e4m3(
        __fadd_rn(lo, __fmul_rn(span, random_uniform(seed, static_cast<uint64_t>(i)))));
}

__global__ void fill_bytes_kernel(uint8_t* data, int64_t n, uint64_t seed, int lo, int hi) {
  pdl_wait();
  pdl_launch_dependents();
  const float span = static_cast<float>(hi - lo + 1);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int v =
        lo + static_cast<int>(__fmul_rn(span, random_uniform(seed, static_cast<uint64_t>(i))));
    data[i] = static_cast<uint8_t>(v > hi ? hi : v);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

void launch_add(Mat out, Mat a, Mat b, cudaStream_t s) {
  const int64_t n = out.rows * out.cols;
  if (n == 0) return;
  launch(add_kernel, grid_for(n, kThreads), kThreads, 0, s, out, a, b);
}

void launch_add_gated(Mat out, Mat a, Mat b, Mat gate, cudaStream_t s) {
  const int64_t n = out.rows * out.cols;
  if (n == 0) return;
  launch(add_gated_kernel, grid_for(n, kThreads), kThreads, 0, s, out, a, b, gate);
}

void launch_cast(Mat out, Mat x, cudaStream_t s) {
  const int64_t n = out.rows * out.cols;
  if (n == 0) return;
  launch(cast_kernel, grid_for(n, kThreads), kThreads, 0, s, out, x);
}

void launch_add_bias(Mat out, const void* bias, Elem bias_type, cudaStream_t s) {
  const int64_t n = out.rows * out.cols;
  if (n == 0) return;
  launch(add_bias_kernel, grid_for(n, kThreads), kThreads, 0, s, out, bias, bias_type);
}

void launch_gather_rows(Mat out, Mat x, const int32_t* idx, cudaStream_t s) {
  if (out.rows == 0 || out.cols == 0) return;
  if (out.type == Elem::kF32)
    launch(gather_rows_kernel<uint32_t>, static_cast<unsigned>(out.rows), kThreads, 0, s, out, x,
           idx);
  else
    launch(gather_rows_kernel<uint16_t>, static_cast<unsigned>(out.rows), kThreads, 0, s, out, x,
           idx);
}

void launch_embedding(Mat out, const int32_t* ids, const void* table, Elem table_type,
                      int64_t table_rows, int64_t vocab_start, cudaStream_t s) {
  if (out.rows == 0 || out.cols == 0) return;
  const int64_t row_bytes = out.cols * elem_bytes(out.type);
  if (table_type == out.type && row_bytes % 16 == 0 &&
      (out.stride * elem_bytes(out.type)) % 16 == 0 && aligned16(out.data) && aligned16(table)) {
    const int64_t words = row_bytes / 16;
    const unsigned threads = static_cast<unsigned>(std::min<int64_t>(1024, (words + 31) / 32 * 32));
    launch(embedding_vec_kernel, static_cast<unsigned>(out.rows), threads, 0, s, out, ids,
           static_cast<const uint4*>(table), table_rows, vocab_start, words);
    return;
  }
  launch(embedding_kernel, static_cast<unsigned>(out.rows), kThreads, 0, s, out, ids, table,
         table_type, table_rows, vocab_start);
}

void launch_glu(Mat out, Mat x, int act, float alpha, float limit, cudaStream_t s) {
  const int64_t n = out.rows * out.cols;
  if (n == 0) return;
  const bool vec = out.type == x.type && out.type != Elem::kF32 && out.cols % 8 == 0 &&
                   out.stride % 8 == 0 && x.stride % 8 == 0 && aligned16(out.data) &&
                   aligned16(x.data);
  if (vec && out.type == Elem::kBF16) {
    launch(glu_kernel<__nv_bfloat16, 8>, grid_for(n / 8, kThreads), kThreads, 0, s, out, x, act,
           alpha, limit);
  } else if (vec && out.type == Elem::kF16) {
    launch(glu_kernel<__half, 8>, grid_for(n / 8, kThreads), kThreads, 0, s, out, x, act, alpha,
           limit);
  } else if (out.type == x.type && out.type == Elem::kF32) {
    launch(glu_kernel<float, 1>, grid_for(n, kThreads), kThreads, 0, s, out, x, act, alpha, limit);
  } else if (out.type == x.type && out.type == Elem::kBF16) {
    launch(glu_kernel<__nv_bfloat16, 1>, grid_for(n, kThreads), kThreads, 0, s, out, x, act, alpha,
           limit);
  } else {
    launch(glu_kernel<__half, 1>, grid_for(n, kThreads), kThreads, 0, s, out, x, act, alpha, limit);
  }
}

void launch_fill_uniform(void* data, Elem type, int64_t n, uint64_t seed, float lo, float hi,
                         cudaStream_t s) {
  if (n == 0) return;
  launch(fill_uniform_kernel, grid_for(n, kThreads, 132 * 64), kThreads, 0, s, data, type, n, seed,
         lo, hi - lo);
}

void launch_fill_uniform_f8(uint8_t* data, int64_t n, uint64_t seed, float lo, float hi,
                            cudaStream_t s) {
  if (n == 0) return;
  launch(fill_uniform_f8_kernel, grid_for(n, kThreads, 132 * 64), kThreads, 0, s, data, n, seed, lo,
         hi - lo);
}

void launch_fill_bytes(uint8_t* data, int64_t n, uint64_t seed, int lo, int hi, cudaStream_t s) {
  if (n == 0) return;
  launch(fill_bytes_kernel, grid_for(n, kThreads, 132 * 64), kThreads, 0, s, data, n, seed, lo, hi);
}

}  // namespace atom::kernels::cuda
