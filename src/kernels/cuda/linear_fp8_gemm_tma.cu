// The FP8 GEMM's second wgmma variant: the problem of linear_fp8_gemm.cu (e4m3 operands, fp32
// accumulators, every 128-deep k block promoted into fp32 totals, with the block's scales in the
// block-scaled recipe) on 128 x 256 output tiles: a third fewer L2-to-SM bytes per FLOP than
// 128 x 128 tiles (A 16 KB + B 32 KB per k block for 8.4 MFLOP, against 32 KB for 4.2 MFLOP).
// The tiles come by the bulk tensor copy engine (TMA: one thread issues three 16 KB boxes per k
// block, 128-byte swizzled as the descriptors expect, rows and k past the tensor zero-filled)
// into kStages stages completing on "full" mbarriers. Warpgroup 1 + w (w = 0, 1) owns the
// tile's 128 columns [128 w, 128 w + 128) — one 128-wide weight block, so one weight scale per k
// block — over all 128 rows, as two 64-row halves: per k block and half, four wgmma m64n128k32
// into one 64-register accumulator, retired and promoted into 128 registers of totals (rows'
// activation scales x the block's weight scale). The producer's registers are cut to 40 so the
// consumers get 232.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/linear_fp8_launch.h"
#include "kernels/cuda/linear_fp8_wgmma.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace atom::kernels::cuda {

namespace {

constexpr int kBM = 128, kBN = 256, kBK = 128, kStages = 4, kThreads = 384;
constexpr int kBox = 128 * 128;  // one TMA box: 128 rows x 128 bytes
constexpr int kStageA = kBox, kStageBytes = kStageA + 2 * kBox;
constexpr int kSmem = kStages * kStageBytes + 2 * kStages * 8 + 1024;
constexpr int kGroupM = 8;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128 * 40 + 256 * 232 <= 64 K

struct TmaMaps {
  CUtensorMap a, b;
};

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

template <bool kBlockScale, typename TO>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_gemm_tma_kernel(const __grid_constant__ TmaMaps maps, Fp8GemmArgs g) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023) & ~1023u;
  const uint32_t bar = base + kStages * kStageBytes;
  auto full = [&](int st) { return bar + 8 * st; };
  auto empty = [&](int st) { return bar + 8 * (kStages + st); };

  const int m_tiles = static_cast<int>((g.m + kBM - 1) / kBM);
  const int n_tiles = static_cast<int>((g.n + kBN - 1) / kBN);
  const int pid = static_cast<int>(blockIdx.x), in_group = kGroupM * n_tiles;
  const int first_m = (pid / in_group) * kGroupM, gsize = min(m_tiles - first_m, kGroupM);
  const int m_tile = first_m + (pid % in_group) % gsize, n_tile = (pid % in_group) / gsize;
  const int m0 = m_tile * kBM, n0 = n_tile * kBN;
  const int nk = static_cast<int>((g.k + kBK - 1) / kBK);

  if (threadIdx.x == 0) {
    for (int st = 0; st < kStages; ++st) {
      mbar_init(full(st), 1);
      mbar_init(empty(st), 256);
    }
    mbar_fence_init();
  }
  __syncthreads();
  pdl_wait();  // xq and sx come from the quantisation kernel
  pdl_launch_dependents();

  if (threadIdx.x < 128) {
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      for (int kb = 0; kb < nk; ++kb) {
        const int st = kb % kStages;
        if (kb >= kStages) mbar_wait(empty(st), ((kb / kStages) - 1) & 1);
        const uint32_t sa = base + st * kStageBytes, sb = sa + kStageA;
        mbar_expect_tx(full(st), kStageBytes);
        tma_load_2d(sa, &maps.a, kb * kBK, m0, full(st));
        tma_load_2d(sb, &maps.b, kb * kBK, n0, full(st));
        tma_load_2d(sb + kBox, &maps.b, kb * kBK, n0 + 128, full(st));
      }
    }
    return;
  }
  setmaxnreg_inc<kConsumerRegs>();
  const int ct = threadIdx.x - 128, w = ct >> 7, wi = (ct >> 5) & 3, lane = ct & 31;
  const int g8 = lane >> 2, c4 = lane & 3;
  const int rloc = wi * 16 + g8;  // this thread's rows of a 64-row half: rloc, rloc + 8
  // This warpgroup's weight block (kBlockScale) and whether any of its columns exist.
  const int64_t gn = (g.n + 127) / 128;
  const int64_t nb = static_cast<int64_t>(n_tile) * 2 + w;
  const bool cols = nb < gn;
  const float* swp = g.sw + min(nb, gn - 1) * nk;
  float acc[64], tot[2][64];
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    acc[i] = 0.0f;
    tot[0][i] = 0.0f;
    tot[1][i] = 0.0f;
  }
  for (int kb = 0; kb < nk; ++kb) {
    const int st = kb % kStages;
    // The k block's scales, loaded before the wait: the weight block's, and (kBlockScale) the
    // four rows' activation scales (rows past M read row 0's; their totals are not stored).
    float s[2][2];
    {
      const float swv = kBlockScale ? __ldg(swp + kb) : 1.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          float sx = 1.0f;
          if constexpr (kBlockScale) {
            const int64_t m = m0 + 64 * h + rloc + 8 * hh;
            sx = __ldg(g.a.sx + static_cast<int64_t>(kb) * g.a.ld_sx + (m < g.m ? m : 0));
          }
          s[h][hh] = sx * swv;
        }
    }
    mbar_wait(full(st), (kb / kStages) & 1);
    const uint32_t sa = base + st * kStageBytes, sb = sa + kStageA + w * kBox;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 32; ++kk)
        wgmma_m64n128k32_e4m3(acc, wgmma_desc(sa + h * (64 * 128) + kk * 32, 16, 1024),
                              wgmma_desc(sb + kk * 32, 16, 1024), kk > 0 ? 1 : 0);
      wgmma_commit();
      wgmma_wait<0>();
      if (h == 1) mbar_arrive(empty(st));  // both halves' MMAs reading the stage have retired
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        tot[h][nt * 4 + 0] = fmaf(acc[nt * 4 + 0], s[h][0], tot[h][nt * 4 + 0]);
        tot[h][nt * 4 + 1] = fmaf(acc[nt * 4 + 1], s[h][0], tot[h][nt * 4 + 1]);
        tot[h][nt * 4 + 2] = fmaf(acc[nt * 4 + 2], s[h][1], tot[h][nt * 4 + 2]);
        tot[h][nt * 4 + 3] = fmaf(acc[nt * 4 + 3], s[h][1], tot[h][nt * 4 + 3]);
      }
    }
  }
  if (!cols) return;
  const bool pair_ok =
      g.out.stride % 2 == 0 && (reinterpret_cast<uintptr_t>(g.out.data) % (2 * sizeof(TO))) == 0;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int64_t m = m0 + 64 * h + rloc + 8 * hh;
      if (m >= g.m) continue;
      float rs = 1.0f;
      if constexpr (!kBlockScale) rs = g.a.sx[m];
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        const int64_t n = n0 + 128 * w + nt * 8 + 2 * c4;
        if (n >= g.n) continue;
        float v[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          v[j] = tot[h][nt * 4 + 2 * hh + j];
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

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A [rows, cols] uint8 matrix with `stride` bytes between rows, in 128 x 128-byte boxes.
bool encode(CUtensorMap* m, const void* data, int64_t rows, int64_t cols, int64_t stride) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride)};
  const cuuint32_t box[2] = {128, 128}, estr[2] = {1, 1};
  return encode_fn()(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(data), dims, strides,
                     box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <bool kBlockScale, typename TO>
void launch_typed(const TmaMaps& maps, const Fp8GemmArgs& g, cudaStream_t s) {
  static std::atomic<uint64_t> smem_done{0};
  auto kernel = fp8_gemm_tma_kernel<kBlockScale, TO>;
  max_dynamic_smem_once(smem_done, kernel, kSmem);
  const int64_t tiles = ((g.m + kBM - 1) / kBM) * ((g.n + kBN - 1) / kBN);
  launch(kernel, dim3(static_cast<unsigned>(tiles)), kThreads, kSmem, s, maps, g);
}

}  // namespace

bool fp8_gemm_tma_supported(const Fp8GemmArgs& g) {
  return fp8_gemm_wgmma_supported(g) && encode_fn() != nullptr && g.m < (int64_t{1} << 31) &&
         g.n < (int64_t{1} << 31) && g.k < (int64_t{1} << 31);
}

void launch_fp8_gemm_tma(const Fp8GemmArgs& g, cudaStream_t s) {
  TmaMaps maps;
  if (!encode(&maps.a, g.a.xq, g.m, g.k, g.a.ldq) || !encode(&maps.b, g.w, g.n, g.k, g.k)) {
    launch_fp8_gemm_wgmma(g, s);  // (supported() checked the encoder exists; shapes it rejects)
    return;
  }
  const bool block = g.gran == Fp8Gran::kBlock;
  if (g.out.type == Elem::kBF16)
    block ? launch_typed<true, __nv_bfloat16>(maps, g, s)
          : launch_typed<false, __nv_bfloat16>(maps, g, s);
  else
    block ? launch_typed<true, float>(maps, g, s) : launch_typed<false, float>(maps, g, s);
}

}  // namespace atom::kernels::cuda
