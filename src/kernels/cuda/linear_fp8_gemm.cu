// The FP8 GEMM on Hopper's warpgroup MMA: out [M, N] = xq [M, K] · wᵀ [N, K] with e4m3 operands
// and fp32 accumulators, for
//   kBlockScale: 128x128 weight blocks and 1x128 activation groups (DeepSeek-V3's recipe, the
//     DeepGEMM problem): each 128-deep k block's product is taken in its own accumulators and
//     promoted into fp32 totals with the block's scales (sx[m, kb] · sw[n / 128, kb]), so the
//     scales never touch the tensor cores' inputs;
//   outer scales (per-channel or per-tensor weight, per-token or static activation): one
//     accumulation over all of K, scaled by sx[m] · sw[n] in the epilogue.
// A CTA computes one 128x128 output tile (grouped raster: 8 m tiles walk the n tiles together, so
// a wave's weight and activation tiles are read from L2). Warpgroup 0 is the producer: its
// threads copy each k block's A and B tiles (128 rows x 128 bytes, 16-byte chunk c of row r at
// chunk c ^ (r % 8), the 128-byte swizzle the descriptors name, as fused_moe_gemm.cu) and the
// block's 128 activation scales with cp.async into a ring of kStages stages, announced on a
// "full" mbarrier; warpgroups 1 and 2 each multiply 64 of the rows with wgmma m64n128k32 (four
// per k block), and hand a stage back on its "empty" mbarrier once their MMAs reading it have
// retired. The two consumers are not in lockstep, so one's promotion overlaps the other's MMAs.
// Every warpgroup fits the 168 registers a thread of a 384-thread CTA gets (no setmaxnreg: the
// producer spilled at 56 and at 40).
// Rows past M or N and k past K are zero-filled and their results not stored. For grids of fewer
// tiles than SMs (small M or N) the k blocks can be split over `splits` CTAs per tile, whose fp32
// totals a second kernel sums in a fixed order (deterministic).
#include <algorithm>
#include <atomic>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/linear_fp8_launch.h"
#include "kernels/cuda/linear_fp8_wgmma.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace atom::kernels::cuda {

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 128, kStages = 6, kThreads = 384;
constexpr int kTileBytes = kBM * kBK;  // 16 KB of e4m3
constexpr int kStageBytes = 2 * kTileBytes;
constexpr int kSxBytes = kBM * 4;
constexpr int kSmem = kStages * kStageBytes + kStages * kSxBytes + 2 * kStages * 8 + 1024;
constexpr int kGroupM = 8;

template <bool kBlockScale, typename TO>
__global__ void __launch_bounds__(kThreads, 1) fp8_gemm_wgmma_kernel(Fp8GemmArgs g) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023) & ~1023u;
  unsigned char* base_ptr = smem_raw + (base - smem_addr(smem_raw));
  const uint32_t sx_base = base + kStages * kStageBytes;
  const float* sx_smem = reinterpret_cast<const float*>(base_ptr + kStages * kStageBytes);
  const uint32_t bar = sx_base + kStages * kSxBytes;
  auto full = [&](int st) { return bar + 8 * st; };
  auto empty = [&](int st) { return bar + 8 * (kStages + st); };

  const int m_tiles = static_cast<int>((g.m + kBM - 1) / kBM);
  const int n_tiles = static_cast<int>((g.n + kBN - 1) / kBN);
  const int pid = static_cast<int>(blockIdx.x), in_group = kGroupM * n_tiles;
  const int first_m = (pid / in_group) * kGroupM, gsize = min(m_tiles - first_m, kGroupM);
  const int m_tile = first_m + (pid % in_group) % gsize, n_tile = (pid % in_group) / gsize;
  const int64_t m0 = static_cast<int64_t>(m_tile) * kBM, n0 = static_cast<int64_t>(n_tile) * kBN;
  const int nk_all = static_cast<int>((g.k + kBK - 1) / kBK);
  // Split-K: this CTA's k blocks [kb0, kb0 + nk).
  const int split = static_cast<int>(blockIdx.y);
  const int kb0 = split * nk_all / g.splits, nk = (split + 1) * nk_all / g.splits - kb0;

  if (threadIdx.x == 0) {
    for (int st = 0; st < kStages; ++st) {
      mbar_init(full(st), 128);
      mbar_init(empty(st), 256);
    }
    mbar_fence_init();
  }
  __syncthreads();
  pdl_wait();  // xq and sx come from the quantisation kernel
  pdl_launch_dependents();

  if (threadIdx.x < 128) {
    const int t = threadIdx.x, c = t & 7, r0 = t >> 3;
    // This thread's rows r0 + 16 p of both tiles: which exist (bit p), and the first's address.
    uint32_t va = 0, vb = 0;
#pragma unroll
    for (int p = 0; p < 8; ++p) {
      va |= (m0 + r0 + 16 * p < g.m ? 1u : 0u) << p;
      vb |= (n0 + r0 + 16 * p < g.n ? 1u : 0u) << p;
    }
    const uint8_t* A = g.a.xq + (m0 + r0) * g.a.ldq + c * 16;
    const uint8_t* W = g.w + (n0 + r0) * g.k + c * 16;
    const int64_t a_step = 16 * g.a.ldq, w_step = 16 * g.k;
    const uint32_t dst0 = static_cast<uint32_t>(r0 * 128 + ((c ^ (r0 & 7)) << 4));
    for (int kb = 0; kb < nk; ++kb) {
      const int st = kb % kStages;
      if (kb >= kStages) mbar_wait(empty(st), ((kb / kStages) - 1) & 1);
      const uint32_t sa = base + st * kStageBytes + dst0, sb = sa + kTileBytes;
      const int64_t k = static_cast<int64_t>(kb0 + kb) * kBK;
      const bool kv = k + c * 16 < g.k;
#pragma unroll
      for (int p = 0; p < 8; ++p) {
        const bool a_ok = kv && ((va >> p) & 1u), b_ok = kv && ((vb >> p) & 1u);
        cp_async16(sa + p * 16 * 128, a_ok ? A + p * a_step + k : g.a.xq, a_ok);
        cp_async16(sb + p * 16 * 128, b_ok ? W + p * w_step + k : g.w, b_ok);
      }
      if (kBlockScale && t < 32) {
        const int64_t mm = m0 + 4 * t;
        const bool v = mm < g.a.ld_sx;
        cp_async16(sx_base + st * kSxBytes + 16 * t,
                   v ? g.a.sx + static_cast<int64_t>(kb0 + kb) * g.a.ld_sx + mm : g.a.sx, v);
      }
      cp_async_mbar_arrive(full(st));
    }
    cp_async_commit();
    cp_async_wait<0>();
    return;
  }
  const int ct = threadIdx.x - 128, cwg = ct >> 7, wi = (ct >> 5) & 3, lane = ct & 31;
  const int g8 = lane >> 2, c4 = lane & 3;
  const int rloc = cwg * 64 + wi * 16 + g8;  // this thread's rows: rloc, rloc + 8
  float acc[64], tot[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    acc[i] = 0.0f;
    tot[i] = 0.0f;
  }
  const float* swp = g.sw + static_cast<int64_t>(n_tile) * nk_all + kb0;  // bn = bk = 128
  for (int kb = 0; kb < nk; ++kb) {
    const int st = kb % kStages;
    float swv = 1.0f;
    if constexpr (kBlockScale) swv = __ldg(swp + kb);
    mbar_wait(full(st), (kb / kStages) & 1);
    fence_proxy_async();
    const uint32_t sa = base + st * kStageBytes + cwg * (64 * 128),
                   sb = base + st * kStageBytes + kTileBytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 32; ++kk)
      wgmma_m64n128k32_e4m3(acc, wgmma_desc(sa + kk * 32, 16, 1024),
                            wgmma_desc(sb + kk * 32, 16, 1024), kk > 0 ? 1 : 0);
    wgmma_commit();
    // Every k block's product is promoted into fp32 totals, scaled or not: the FP8 MMA's own
    // accumulation keeps fewer bits than fp32 (over K = 1,024 in one accumulator the error
    // against the CPU was 7e-4 relative; per k block 2e-4, H200, 2026-12-02).
    wgmma_wait<0>();
    float s0 = swv, s1 = swv;
    if constexpr (kBlockScale) {
      s0 *= sx_smem[st * kBM + rloc];
      s1 *= sx_smem[st * kBM + rloc + 8];
    }
    mbar_arrive(empty(st));
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
      tot[nt * 4 + 0] = fmaf(acc[nt * 4 + 0], s0, tot[nt * 4 + 0]);
      tot[nt * 4 + 1] = fmaf(acc[nt * 4 + 1], s0, tot[nt * 4 + 1]);
      tot[nt * 4 + 2] = fmaf(acc[nt * 4 + 2], s1, tot[nt * 4 + 2]);
      tot[nt * 4 + 3] = fmaf(acc[nt * 4 + 3], s1, tot[nt * 4 + 3]);
    }
  }
  if (g.splits > 1) {  // fp32 totals of this split; the reduction scales and adds the bias
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int64_t m = m0 + rloc + 8 * hh;
      if (m >= g.m) continue;
      float* prow = g.partial + (static_cast<int64_t>(split) * g.m + m) * g.n;
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        const int64_t n = n0 + nt * 8 + 2 * c4;
        if (n < g.n) prow[n] = tot[nt * 4 + 2 * hh];
        if (n + 1 < g.n) prow[n + 1] = tot[nt * 4 + 2 * hh + 1];
      }
    }
    return;
  }
  const bool pair_ok =
      g.out.stride % 2 == 0 && (reinterpret_cast<uintptr_t>(g.out.data) % (2 * sizeof(TO))) == 0;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int64_t m = m0 + rloc + 8 * hh;
    if (m >= g.m) continue;
    float rs = 1.0f;
    if constexpr (!kBlockScale) rs = g.a.sx[m];
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
      const int64_t n = n0 + nt * 8 + 2 * c4;
      if (n >= g.n) continue;
      float v[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int i = nt * 4 + 2 * hh + j;
        v[j] = tot[i];
        if constexpr (!kBlockScale) {
          const int64_t nn = min(n + j, g.n - 1);
          v[j] *= rs * (g.gran == Fp8Gran::kChannel ? g.sw[nn] : g.sw[0]);
        }
        if (g.bias && n + j < g.n) v[j] += load_elem(g.bias, g.bias_type, n + j);
      }
      store2<TO>(g, m, n, v[0], v[1], pair_ok);
    }
  }
}

// out[m, n] = sum over splits of partial[s, m, n] (in split order), then (outer scales) x sx[m]
// sw[n], + bias[n].
__global__ void __launch_bounds__(256) fp8_splitk_reduce_kernel(Fp8GemmArgs g) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t total = g.m * g.n;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * 256) {
    const int64_t m = i / g.n, n = i % g.n;
    float v = 0.0f;
    for (int s = 0; s < g.splits; ++s) v += g.partial[s * total + i];
    if (g.gran != Fp8Gran::kBlock)
      v *= g.a.sx[m] * (g.gran == Fp8Gran::kChannel ? g.sw[n] : g.sw[0]);
    if (g.bias) v += load_elem(g.bias, g.bias_type, n);
    store_elem(g.out.data, g.out.type, m * g.out.stride + n, v);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

bool is_sm90() {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major == 9;
}

template <bool kBlockScale, typename TO>
void launch_typed(const Fp8GemmArgs& g, cudaStream_t s) {
  static std::atomic<uint64_t> smem_done{0};
  auto kernel = fp8_gemm_wgmma_kernel<kBlockScale, TO>;
  max_dynamic_smem_once(smem_done, kernel, kSmem);
  const int64_t tiles = ((g.m + kBM - 1) / kBM) * ((g.n + kBN - 1) / kBN);
  launch(kernel, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(g.splits)), kThreads,
         kSmem, s, g);
  if (g.splits > 1) launch(fp8_splitk_reduce_kernel, dim3(grid_for(g.m * g.n, 256)), 256, 0, s, g);
}

}  // namespace

bool fp8_gemm_wgmma_supported(const Fp8GemmArgs& g) {
  static const bool sm90 = is_sm90();
  if (!sm90 || g.act == Fp8Act::kNone || g.k % 16 != 0 || !aligned16(g.w) || !aligned16(g.a.xq) ||
      !aligned16(g.a.sx) || g.a.ldq % 16 != 0 || g.a.ld_sx % 4 != 0)
    return false;
  if (g.out.type != Elem::kBF16 && g.out.type != Elem::kF32) return false;
  if (g.gran == Fp8Gran::kBlock)
    return g.bn == 128 && g.bk == 128 && g.act == Fp8Act::kBlock && g.a.group == 128;
  return g.act == Fp8Act::kToken || g.act == Fp8Act::kStatic;
}

void launch_fp8_gemm_wgmma(const Fp8GemmArgs& g, cudaStream_t s) {
  const bool block = g.gran == Fp8Gran::kBlock;
  if (g.out.type == Elem::kBF16)
    block ? launch_typed<true, __nv_bfloat16>(g, s) : launch_typed<false, __nv_bfloat16>(g, s);
  else
    block ? launch_typed<true, float>(g, s) : launch_typed<false, float>(g, s);
}

}  // namespace atom::kernels::cuda
