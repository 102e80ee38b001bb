// The grouped GEMMs of fused_moe's larger batches, on Hopper's warpgroup MMA. A persistent CTA
// of two warpgroups walks work items (m tile of the sorted rows, n tile), n fastest, so the m
// tiles of a slot and the n tiles of an m tile run close together in time (their weights and
// rows are read from L2). A work item is kBM sorted rows of one slot (64 or 128) against 256
// weight rows, wgmma m64n128k16 with both operands in shared memory and fp32 accumulators:
// kBM 64: both warpgroups share the A tile (the rows: x gathered by token for w13, act for w2)
// and each multiplies it with its own 128 weight rows; kBM 128: each warpgroup takes 64 of the
// rows against all 256 weight rows (two MMAs per k step; half the weight traffic per row, which
// is what binds at 16k routed rows, for more padding). Per 128 weight rows, w13 has 64 gate
// rows and the 64 up rows of the same intermediate index, so the accumulator columns j and
// j + 64 of a thread are gate and up of one index and SiLU·mul happens in registers; the
// result is rounded to the activation type and written to act in sorted order. w2's epilogue
// writes each row of y at its (token, choice) row. Tiles are 64-column k slices laid out as the
// attention kernels' Q/K tiles (128-byte rows, 16-byte chunk c of row r at chunk c ^ (r % 8));
// cp.async fills kStages stages, kStages - 2 ahead (the stage being refilled was read by the
// MMAs two steps back, which have retired in every warpgroup by the barrier of this step). The
// pipeline runs across work items: the next item's first stages load while this one's last
// MMAs and epilogue run, and each item's table entries are fetched one item ahead. Rows past a
// tile's count, weight rows past I (w13) or H (w2) and k past the reduction length are
// zero-filled; their results are not stored.
//
// GPT-OSS's experts take the extended epilogue (kExt, a second instantiation, so the SiLU·mul
// path keeps its code): w13 adds the slot's gate/up biases to the accumulators before the
// activation, which is SiLU·mul or the clamped SwiGLU; w2 adds the slot's output bias before y is
// rounded. The biases are read as pairs of elements (a thread's two adjacent columns) from L2.
//
// MXFP4 experts (kQMx, BF16 only, with the extended epilogue): the stages hold the B tile's blocks
// and scales (cp.async; the scales are stored k-group-major, so a tile's rows of one group are
// contiguous); at each k step every thread expands one tile row into one of two BF16 B buffers
// in the layout above (a fence and a barrier before the MMAs read it), then the MMAs run as for
// BF16 weights. The expansion is exact: the results are the BF16 path's on the encoded weights.
// FP8 experts (kQF8, likewise): a stage holds the tile's e4m3 codes (kBN rows of 64 bytes) and
// one F32 scale a row (a 64-wide k step lies in one scale block: fp8_bk % 64 == 0), expanded
// into BF16 as the loader's dequantisation rounds them, so again the results are the BF16 path's
// on the weights the codes and scales encode.
#include <algorithm>
#include <atomic>
#include <type_traits>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/fused_moe.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace atom::kernels::cuda::moe {

namespace {

constexpr int kBN = 256, kBK = 64;
constexpr int kThreads = 256;

__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}

// 4 bytes global -> shared (through L1: a scale serves many tiles); zero-filled when !valid.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

// kQMx: a stage holds the B tile's MXFP4 bytes (kBN rows of 32 bytes) and its scales (two
// groups of kBN bytes) instead of BF16; kQF8: its e4m3 codes (kBN rows of 64 bytes) and a F32
// scale a row. Each k step expands them into one of two BF16 B buffers (the swizzled layout the
// MMAs read), one tile row a thread.
template <int kBM, int kQ = kQNone>
struct Cfg {
  static constexpr int kStages = kBM == 64 ? 5 : 4, kAhead = kStages - 2;
  static constexpr int kStageA = kBM * kBK * 2;
  // bytes (quantised: codes and scales, padded so that every stage stays 1024-byte aligned)
  static constexpr int kStageB = kQ == kQMx   ? (kBN * kBK / 2 + 2 * kBN + 1023) / 1024 * 1024
                                 : kQ == kQF8 ? (kBN * kBK + 4 * kBN + 1023) / 1024 * 1024
                                              : kBN * kBK * 2;
  static constexpr int kStageBytes = kStageA + kStageB;
  static constexpr int kBBuf = kBN * kBK * 2;  // a BF16 B buffer (kQ: two of them)
  static constexpr int kSmem = kStages * kStageBytes + (kQ != kQNone ? 2 * kBBuf : 0) + 1024;
  static constexpr int kARows = kBM / 32;  // A rows a loader thread copies
  static constexpr int kNH = kBM / 64;     // 128-column halves of the tile per warpgroup
  static_assert(kStageBytes % 1024 == 0, "stages stay 1024-byte aligned");
};

template <typename T, bool kW13, int kBM, bool kExt, int kQ>
__global__ void __launch_bounds__(kThreads, 1) moe_gemm_kernel(GemmArgs g) {
  using C = Cfg<kBM, kQ>;
  pdl_wait();  // the tile table (sort kernel) and, for w2, act (the w13 GEMM)
  pdl_launch_dependents();
  const int n_tiles_n =
      kW13 ? static_cast<int>((g.I + 127) / 128) : static_cast<int>((g.H + kBN - 1) / kBN);
  const int total = *g.num_tiles * n_tiles_n;
  if (static_cast<int>(blockIdx.x) >= total) return;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t sbase = (smem_addr(smem_raw) + 1023) & ~1023u;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const int64_t kdim = kW13 ? g.H : g.I;
  const int nk = static_cast<int>((kdim + kBK - 1) / kBK);
  const T* A = static_cast<const T*>(g.a);
  const T* W = static_cast<const T*>(g.w);
  const uint8_t* WQ = static_cast<const uint8_t*>(g.w);       // quantised: codes
  const uint8_t* SQ = static_cast<const uint8_t*>(g.scales);  // kQMx: scales [S, G, R]
  const float* SF = static_cast<const float*>(g.scales);      // kQF8: scales [S, gr, gk]
  const int64_t n_groups = kdim / 32, R = kW13 ? 2 * g.I : g.H;
  const int fbn = g.fp8_bn > 0 ? g.fp8_bn : 1, fbk = g.fp8_bk;
  const int64_t fgk = fbk ? (kdim + fbk - 1) / fbk : 1, fgr = (R + fbn - 1) / fbn;
  const uint32_t sbuf = sbase + C::kStages * C::kStageBytes;  // kQ: the BF16 B buffers
  // The weight row (within its slot) of B tile row `row`, and whether it exists.
  auto tile_wrow = [&](int n, int row, bool& v) -> int64_t {
    if (kW13) {  // rows [64 q, 64 q + 64): gate (q even) or up (q odd) of index block q / 2
      const int p = row >> 5;
      const int64_t i = static_cast<int64_t>(n) * 128 + 64 * (p >> 2) + 32 * (p & 1) + (row & 31);
      v = i < g.I;
      return (p & 3) < 2 ? i : g.I + i;
    }
    const int64_t h = static_cast<int64_t>(n) * kBN + row;
    v = h < g.H;
    return h;
  };

  // Loader: thread tid copies 16-byte chunk lc of rows lr + 32 p (A: p < kARows; B: p < 8),
  // whose swizzled places differ by whole 8-row groups.
  const int lc = tid & 7, lr = tid >> 3;
  const uint32_t ldst = static_cast<uint32_t>(lr * 128 + ((lc ^ (lr & 7)) << 4));
  int lw = static_cast<int>(blockIdx.x), lkt = 0;
  const T* asrc[C::kARows];
  bool aval[C::kARows];
  int l_n = 0, l_e = 0;
  // The next work item's table entries, fetched while this one's first stage is issued (tile t
  // holds sorted positions [t kBM, (t + 1) kBM): every slot's rows are padded to whole tiles).
  int nx_e = 0, nx_rows = 0, nx_r[C::kARows];
  bool nx_have = false;
  auto fetch_item = [&](int w) {
    const int tile = w / n_tiles_n;
    nx_e = g.tile_expert[tile];
    nx_rows = g.tile_rows[tile];
#pragma unroll
    for (int q = 0; q < C::kARows; ++q)
      nx_r[q] = kW13 ? g.sorted_rows[tile * kBM + lr + 32 * q] : tile * kBM + lr + 32 * q;
  };
  auto set_load_item = [&] {
    if (lw >= total) return;
    if (!nx_have) fetch_item(lw);
    nx_have = false;
    l_n = lw % n_tiles_n;
    l_e = nx_e;
#pragma unroll
    for (int q = 0; q < C::kARows; ++q) {
      aval[q] = lr + 32 * q < nx_rows && nx_r[q] >= 0;
      // w13: x row of the token (row t * K + j); w2: act row of the sorted position
      asrc[q] =
          A + static_cast<int64_t>(aval[q] ? (kW13 ? nx_r[q] / g.K : nx_r[q]) : 0) * g.a_stride;
    }
  };
  auto load_stage = [&](int stage) {
    if (lw < total) {
      const uint32_t sa = sbase + stage * C::kStageBytes, sb = sa + C::kStageA;
      const int64_t k = static_cast<int64_t>(lkt) * kBK + lc * 8;
      const bool kv = k < kdim;
#pragma unroll
      for (int q = 0; q < C::kARows; ++q) {
        const bool v = aval[q] && kv;
        cp_async16(sa + ldst + q * 32 * 128, v ? asrc[q] + k : A, v);
      }
      if constexpr (kQ == kQF8) {
        // codes: 16-byte chunk ci & 3 of tile row ci >> 2, ci = tid + 256 q
        const int64_t k0 = static_cast<int64_t>(lkt) * kBK;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int ci = tid + kThreads * q, row = ci >> 2, part = ci & 3;
          bool v;
          const int64_t wrow = tile_wrow(l_n, row, v);
          const int64_t kq = k0 + part * 16;
          v = v && kq < kdim;
          cp_async16(sb + row * 64 + part * 16,
                     v ? WQ + (static_cast<int64_t>(l_e) * R + wrow) * kdim + kq : WQ, v);
        }
        // the scale of tile row tid at this k step
        bool v;
        const int64_t wrow = tile_wrow(l_n, tid, v);
        v = v && k0 < kdim;
        cp_async4(sb + kBN * 64 + tid * 4,
                  v ? SF + static_cast<int64_t>(l_e) * fgr * fgk +
                          fp8_scale_index(wrow, k0, fbn, fbk, fgk)
                    : SF,
                  v);
      } else if constexpr (kQ == kQMx) {
        // blocks: tile rows pr and pr + 128, 16-byte half ph of their 32 bytes
        const int pr = tid >> 1, ph = tid & 1;
        const int64_t kq = static_cast<int64_t>(lkt) * kBK + ph * 32;
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          bool v;
          const int64_t wrow = tile_wrow(l_n, pr + 128 * q, v);
          v = v && kq < kdim;
          cp_async16(sb + (pr + 128 * q) * 32 + ph * 16,
                     v ? WQ + (static_cast<int64_t>(l_e) * R + wrow) * (kdim / 2) + kq / 2 : WQ, v);
        }
        // scales: 16 rows of one group each (threads 0-31), rows' runs contiguous in [S, G, R]
        if (tid < 32) {
          const int gg = tid >> 4, row = (tid & 15) * 16;
          bool v;
          const int64_t wrow = tile_wrow(l_n, row, v);
          const int64_t grp = static_cast<int64_t>(lkt) * 2 + gg;
          v = v && grp < n_groups;
          cp_async16(sb + kBN * 32 + gg * kBN + row,
                     v ? SQ + (static_cast<int64_t>(l_e) * n_groups + grp) * R + wrow : SQ, v);
        }
      } else {
#pragma unroll
        for (int p = 0; p < 8; ++p) {
          bool v;
          const int64_t wrow = static_cast<int64_t>(l_e) * R + tile_wrow(l_n, 32 * p + lr, v);
          v = v && kv;
          cp_async16(sb + ldst + p * 32 * 128, v ? W + wrow * kdim + k : W, v);
        }
      }
      const int nw = lw + static_cast<int>(gridDim.x);
      if (lkt == 0 && nw < total) {
        fetch_item(nw);
        nx_have = true;
      }
      if (++lkt == nk) {
        lkt = 0;
        lw = nw;
        set_load_item();
      }
    }
    cp_async_commit();
  };

  set_load_item();
#pragma unroll
  for (int s = 0; s < C::kAhead; ++s) load_stage(s);

  float acc[C::kNH][64];
#pragma unroll
  for (int h = 0; h < C::kNH; ++h)
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[h][i] = 0.0f;
  // This warpgroup's 64-row group of the tile and its 128-column halves.
  const int mg = kBM == 64 ? 0 : wg;
  auto half_of = [&](int h) { return kBM == 64 ? wg : h; };
  const int wi = warp & 3, g8 = lane >> 2, c4 = lane & 3;
  int step = 0;
  for (int cw = static_cast<int>(blockIdx.x); cw < total; cw += static_cast<int>(gridDim.x)) {
    // The epilogue's table entries, loaded now and used after the k loop.
    const int tile = cw / n_tiles_n, n = cw % n_tiles_n;
    const int nrows = g.tile_rows[tile];
    [[maybe_unused]] const int ep_e = kExt ? g.tile_expert[tile] : 0;
    int ep_r[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      ep_r[hh] = kW13 ? 0 : g.sorted_rows[tile * kBM + mg * 64 + wi * 16 + g8 + 8 * hh];
    for (int ckt = 0; ckt < nk; ++ckt, ++step) {
      cp_async_wait<C::kAhead - 1>();
      fence_proxy_async();  // this thread's cp.async data, before the tensor cores read it
      __syncthreads();
      uint32_t sb = sbase + (step % C::kStages) * C::kStageBytes + C::kStageA;
      if constexpr (kQ != kQNone) {
        // Tile row tid -> 64 BF16 values in B buffer step & 1 (read by the MMAs of step - 2 at
        // the latest, retired by this step's barrier), 32 values a half q: kQF8 from 64 codes and
        // their scale, kQMx from 32 bytes and two scales.
        const uint32_t dst = sbuf + (step & 1) * C::kBBuf;
        uint4 pk[kQ == kQF8 ? 4 : 2];
        uint32_t sc[2];
        float scale = 0.0f;
        if constexpr (kQ == kQF8) {
#pragma unroll
          for (int q = 0; q < 4; ++q) pk[q] = ld_shared_v4(sb + tid * 64 + q * 16);
          asm volatile("ld.shared.f32 %0, [%1];" : "=f"(scale) : "r"(sb + kBN * 64 + tid * 4));
        } else {
#pragma unroll
          for (int q = 0; q < 2; ++q) pk[q] = ld_shared_v4(sb + tid * 32 + q * 16);
#pragma unroll
          for (int q = 0; q < 2; ++q)
            asm volatile("ld.shared.u8 %0, [%1];"
                         : "=r"(sc[q])
                         : "r"(sb + kBN * 32 + q * kBN + tid));
        }
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          uint4 o[4];
          if constexpr (kQ == kQF8)
            fp8_expand(pk[2 * q], pk[2 * q + 1], scale, o);
          else
            mxfp4_expand(pk[q], sc[q], o);
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int chunk = q * 4 + u;
            st_shared_v4(dst + tid * 128 + ((chunk ^ (tid & 7)) << 4), o[u]);
          }
        }
        fence_proxy_async();  // the BF16 tile, before the tensor cores read it
        __syncthreads();
        sb = dst;
      }
      load_stage((step + C::kAhead) % C::kStages);
      const uint32_t sa = sbase + (step % C::kStages) * C::kStageBytes + mg * (64 * 128);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)
#pragma unroll
        for (int h = 0; h < C::kNH; ++h)
          wgmma_m64n128k16_ss<T>(acc[h], wgmma_desc(sa + kk * 32, 16, 1024),
                                 wgmma_desc(sb + half_of(h) * (128 * 128) + kk * 32, 16, 1024),
                                 (ckt > 0 || kk > 0) ? 1 : 0);
      wgmma_commit();
      wgmma_wait<1>();  // the previous step's MMAs have retired: its stage may be refilled
    }
    wgmma_wait<0>();
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = mg * 64 + wi * 16 + g8 + 8 * hh;
      if (row >= nrows) continue;
      if (kW13) {
        T* dst = static_cast<T*>(g.out) + static_cast<int64_t>(tile * kBM + row) * g.I;
#pragma unroll
        for (int h = 0; h < C::kNH; ++h)
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            const int64_t i = static_cast<int64_t>(n) * 128 + 64 * half_of(h) + nt * 8 + 2 * c4;
            if (i < g.I) {
              float v0, v1;
              if constexpr (kExt) {
                float gt[2] = {acc[h][nt * 4 + 2 * hh], acc[h][nt * 4 + 2 * hh + 1]};
                float up[2] = {acc[h][(nt + 8) * 4 + 2 * hh], acc[h][(nt + 8) * 4 + 2 * hh + 1]};
                if (g.bias) {
                  const T* b = static_cast<const T*>(g.bias) + static_cast<int64_t>(ep_e) * 2 * g.I;
                  float bg[2], bu[2];
                  load_vec<T, 2>(b + i, bg);
                  load_vec<T, 2>(b + g.I + i, bu);
#pragma unroll
                  for (int q = 0; q < 2; ++q) {
                    gt[q] += bg[q];
                    up[q] += bu[q];
                  }
                }
                v0 = moe_act_times(gt[0], up[0], g.act, g.alpha, g.limit);
                v1 = moe_act_times(gt[1], up[1], g.act, g.alpha, g.limit);
              } else {
                v0 = silu_times(acc[h][nt * 4 + 2 * hh], acc[h][(nt + 8) * 4 + 2 * hh]);
                v1 = silu_times(acc[h][nt * 4 + 2 * hh + 1], acc[h][(nt + 8) * 4 + 2 * hh + 1]);
              }
              *reinterpret_cast<uint32_t*>(dst + i) = pack2<T>(v0, v1);
            }
          }
      } else {
        const int r = ep_r[hh];
        if (r < 0) continue;
        T* dst = static_cast<T*>(g.out) + static_cast<int64_t>(r) * g.H;
#pragma unroll
        for (int h = 0; h < C::kNH; ++h)
#pragma unroll
          for (int nt = 0; nt < 16; ++nt) {
            const int64_t col = static_cast<int64_t>(n) * kBN + 128 * half_of(h) + nt * 8 + 2 * c4;
            if (col < g.H) {
              float v[2] = {acc[h][nt * 4 + 2 * hh], acc[h][nt * 4 + 2 * hh + 1]};
              if constexpr (kExt) {
                if (g.bias) {
                  float b[2];
                  load_vec<T, 2>(
                      static_cast<const T*>(g.bias) + static_cast<int64_t>(ep_e) * g.H + col, b);
                  v[0] += b[0];
                  v[1] += b[1];
                }
              }
              *reinterpret_cast<uint32_t*>(dst + col) = pack2<T>(v[0], v[1]);
            }
          }
      }
    }
  }
  cp_async_wait<0>();
}

template <typename T, bool kW13, int kBM, bool kExt, int kQ>
void launch_gemm(const GemmArgs& g, cudaStream_t s) {
  static std::atomic<uint64_t> smem_done{0};
  auto kernel = moe_gemm_kernel<T, kW13, kBM, kExt, kQ>;
  using C = Cfg<kBM, kQ>;
  max_dynamic_smem_once(smem_done, kernel, C::kSmem);
  const int64_t n_tiles_n = kW13 ? (g.I + 127) / 128 : (g.H + kBN - 1) / kBN;
  const int64_t items = static_cast<int64_t>(g.max_tiles) * n_tiles_n;
  const unsigned grid =
      static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(items, sm_count())));
  launch(kernel, grid, kThreads, C::kSmem, s, g);
}

template <typename T, bool kW13, bool kExt, int kQ>
void launch_rows(const GemmArgs& g, cudaStream_t s) {
  g.tile_rows_cap == 128 ? launch_gemm<T, kW13, 128, kExt, kQ>(g, s)
                         : launch_gemm<T, kW13, 64, kExt, kQ>(g, s);
}

template <typename T, bool kW13>
void launch_ext(const GemmArgs& g, cudaStream_t s) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {  // W8A16 and W4A16, every epilogue
    if (g.fp8_bn) return launch_rows<T, kW13, true, kQF8>(g, s);
    if (g.scales) return launch_rows<T, kW13, true, kQMx>(g, s);
  }
  // The extended epilogue where it changes anything (w2 has no activation).
  const bool ext = g.bias != nullptr || (kW13 && g.act != 0);
  ext ? launch_rows<T, kW13, true, kQNone>(g, s) : launch_rows<T, kW13, false, kQNone>(g, s);
}

template <bool kW13>
void launch_typed(const GemmArgs& g, Elem type, cudaStream_t s) {
  if (type == Elem::kBF16)
    launch_ext<__nv_bfloat16, kW13>(g, s);
  else
    launch_ext<__half, kW13>(g, s);
}

}  // namespace

void launch_moe_gemm_w13(const GemmArgs& g, Elem type, cudaStream_t s) {
  launch_typed<true>(g, type, s);
}

void launch_moe_gemm_w2(const GemmArgs& g, Elem type, cudaStream_t s) {
  launch_typed<false>(g, type, s);
}

}  // namespace atom::kernels::cuda::moe
