// The encoder ops' small kernels (kernels/encoder.h): the row softmax between encoder attention's
// two batched GEMMs, the rotation of channel pairs from tables, GELU, and the gathered mean.
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/encoder_launch.h"

namespace atom::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// One block per row of `cols` F32 scores: p = exp(s - max) / Σ exp(s - max), written as p's type.
__global__ void softmax_rows_kernel(const float* s, void* p, Elem ptype, int64_t cols) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float scratch[32];
  const float* row = s + blockIdx.x * cols;
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, row[c]);
  mx = block_max(mx, scratch);
  __syncthreads();
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(row[c] - mx);
  sum = block_sum(sum, scratch);
  const float inv = 1.0f / sum;
  char* out = static_cast<char*>(p) + blockIdx.x * cols * (ptype == Elem::kF32 ? 4 : 2);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    store_elem(out, ptype, c, expf(row[c] - mx) * inv);
}

__global__ void rotate_pairs_kernel(Mat x, const float* cs, const float* sn, int head_dim) {
  pdl_wait();
  pdl_launch_dependents();
  const int pairs = head_dim / 2;
  const int64_t per_row = x.cols / 2, n = x.rows * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, k = i % per_row;  // pair k of the row: head k / pairs
    const int64_t m = k % pairs;
    char* row = row_of(x, r);
    const float re = load_elem(row, x.type, 2 * k), im = load_elem(row, x.type, 2 * k + 1);
    const float c = cs[r * pairs + m], s = sn[r * pairs + m];
    store_elem(row, x.type, 2 * k, re * c - im * s);
    store_elem(row, x.type, 2 * k + 1, re * s + im * c);
  }
}

__global__ void gelu_kernel(Mat out, Mat x, bool tanh_approx) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t n = out.rows * out.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / out.cols, c = i % out.cols;
    const float v = load_elem(row_of(x, r), x.type, c);
    const float g =
        tanh_approx ? 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))
                    : 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
    store_elem(row_of(out, r), out.type, c, g);
  }
}

// One block per output row.
__global__ void gather_mean_rows_kernel(Mat out, Mat x, const int32_t* idx, int n) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t r = blockIdx.x;
  const float inv = 1.0f / static_cast<float>(n);
  for (int64_t c = threadIdx.x; c < out.cols; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) {
      const int64_t src = idx[r * n + j];
      if (src >= 0 && src < x.rows) acc += load_elem(row_of(x, src), x.type, c);
    }
    store_elem(row_of(out, r), out.type, c, n == 1 ? acc : acc * inv);
  }
}

__global__ void copy_heads_kernel(Mat dst, Mat src, int heads, int dd, int ds) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t per_row = static_cast<int64_t>(heads) * dd, n = dst.rows * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, k = i % per_row, h = k / dd, c = k % dd;
    const float v = c < ds ? load_elem(row_of(src, r), src.type, h * ds + c) : 0.0f;
    store_elem(row_of(dst, r), dst.type, k, v);
  }
}

// copy_heads_kernel two channels a thread (BF16/F16 pairs as one 4-byte access), optionally
// turning each source pair (2m, 2m + 1) by row r's angle m first (cs, sn [rows, ds / 2]; null:
// none): the padded q and k of the flash path written in one pass from the unrotated rows.
template <typename T>
__global__ void copy_head_pairs_kernel(Mat dst, Mat src, int heads, int dd, int ds, const float* cs,
                                       const float* sn) {
  pdl_wait();
  pdl_launch_dependents();
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  const int dp = dd / 2, sp = ds / 2;
  const int64_t per_row = static_cast<int64_t>(heads) * dp, n = dst.rows * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row;
    const int k = static_cast<int>(i - r * per_row), h = k / dp, m = k - h * dp;
    float2 v = make_float2(0.0f, 0.0f);
    if (m < sp) {
      const T2 x = reinterpret_cast<const T2*>(row_of(src, r))[h * sp + m];
      v = make_float2(to_float(x.x), to_float(x.y));
      if (cs) {
        const float c = cs[r * sp + m], s = sn[r * sp + m];
        v = make_float2(v.x * c - v.y * s, v.x * s + v.y * c);
      }
    }
    T2 o;
    o.x = from_float<T>(v.x);
    o.y = from_float<T>(v.y);
    reinterpret_cast<T2*>(row_of(dst, r))[k] = o;
  }
}

}  // namespace

bool launch_copy_head_pairs(Mat dst, Mat src, int heads, int dd, int ds, const float* cs,
                            const float* sn, cudaStream_t stream) {
  auto even = [](const Mat& m) {
    return (reinterpret_cast<uintptr_t>(m.data) & 3) == 0 && (m.rows <= 1 || m.stride % 2 == 0);
  };
  if (dst.type != src.type || dst.type == Elem::kF32 || dd % 2 || ds % 2 || !even(dst) ||
      !even(src))
    return false;
  const int64_t n = dst.rows * heads * (dd / 2);
  if (n == 0) return true;
  if (dst.type == Elem::kBF16)
    launch(copy_head_pairs_kernel<__nv_bfloat16>, grid_for(n, kThreads), kThreads, 0, stream, dst,
           src, heads, dd, ds, cs, sn);
  else
    launch(copy_head_pairs_kernel<__half>, grid_for(n, kThreads), kThreads, 0, stream, dst, src,
           heads, dd, ds, cs, sn);
  return true;
}

void launch_copy_heads(Mat dst, Mat src, int heads, int dd, int ds, cudaStream_t stream) {
  const int64_t n = dst.rows * heads * dd;
  if (n == 0) return;
  launch(copy_heads_kernel, grid_for(n, kThreads), kThreads, 0, stream, dst, src, heads, dd, ds);
}

void launch_softmax_rows(const float* s, void* p, Elem ptype, int64_t rows, int64_t cols,
                         cudaStream_t stream) {
  if (rows == 0) return;
  launch(softmax_rows_kernel, dim3(static_cast<unsigned>(rows)), kThreads, 0, stream, s, p, ptype,
         cols);
}

void launch_rotate_pairs(Mat x, const float* cs, const float* sn, int head_dim,
                         cudaStream_t stream) {
  const int64_t n = x.rows * x.cols / 2;
  if (n == 0) return;
  launch(rotate_pairs_kernel, grid_for(n, kThreads), kThreads, 0, stream, x, cs, sn, head_dim);
}

void launch_gelu(Mat out, Mat x, bool tanh_approx, cudaStream_t stream) {
  const int64_t n = out.rows * out.cols;
  if (n == 0) return;
  launch(gelu_kernel, grid_for(n, kThreads), kThreads, 0, stream, out, x, tanh_approx);
}

void launch_gather_mean_rows(Mat out, Mat x, const int32_t* idx, int n, cudaStream_t stream) {
  if (out.rows == 0) return;
  launch(gather_mean_rows_kernel, dim3(static_cast<unsigned>(out.rows)), kThreads, 0, stream, out,
         x, idx, n);
}

}  // namespace atom::kernels::cuda
