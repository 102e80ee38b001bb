// out [M, N] = x [M, K] · w [N, K]ᵀ for the few rows of a decode step (M <= 4). Such a product
// only streams the weight once, so the kernel is built around the weight read: each warp owns
// kRows output columns, each lane reads 16 bytes of each of their weight rows per step, several
// steps in flight, and x (a few KB) is read through L1.
#include "kernels/cuda/device_common.cuh"

namespace atom::kernels::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kRows = 2;    // weight rows per warp
constexpr int kPrefetchBytes = 8192;  // per weight row, into L2 before the dependency wait

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

// U: 16-byte weight loads per row in flight per lane.
template <typename T, int M, int U>
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
  // Weights are never written by an earlier kernel: pull the start of this warp's rows into L2
  // while the previous kernel drains (PDL), then wait for x.
  {
    const uint32_t bytes = static_cast<uint32_t>(a.k * 2 < kPrefetchBytes ? a.k * 2 : kPrefetchBytes);
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (lane == r) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(w[r]), "r"(bytes) : "memory");
  }
  pdl_wait();
  for (int64_t k0 = lane * 8; k0 < a.k; k0 += kStep * U) {
    uint4 wv[U][kRows];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = k0 + u * kStep;
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        wv[u][r] = k < a.k ? __ldcs(reinterpret_cast<const uint4*>(w[r] + k)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
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

template <typename T, int U>
void launch_unrolled(const SkinnyArgs& a, unsigned grid, cudaStream_t s) {
  switch (a.x.rows) {
    case 1: launch(linear_skinny_kernel<T, 1, U>, grid, kWarps * 32, 0, s, a); break;
    case 2: launch(linear_skinny_kernel<T, 2, U>, grid, kWarps * 32, 0, s, a); break;
    case 3: launch(linear_skinny_kernel<T, 3, U>, grid, kWarps * 32, 0, s, a); break;
    default: launch(linear_skinny_kernel<T, 4, U>, grid, kWarps * 32, 0, s, a); break;
  }
}

// ATOM_SKINNY_UNROLL=4|8 (default 8): loads in flight per lane and row.
int unroll() {
  static const int u = [] {
    const char* e = std::getenv("ATOM_SKINNY_UNROLL");
    return e && std::strcmp(e, "4") == 0 ? 4 : 8;
  }();
  return u;
}

template <typename T>
void launch_typed(const SkinnyArgs& a, cudaStream_t s) {
  const int64_t warps = (a.n + kRows - 1) / kRows;
  const unsigned grid = static_cast<unsigned>((warps + kWarps - 1) / kWarps);
  if (unroll() == 4)
    launch_unrolled<T, 4>(a, grid, s);
  else
    launch_unrolled<T, 8>(a, grid, s);
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
