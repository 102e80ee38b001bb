// Fused experts: the decode path, the counting sort and combine of the grouped-GEMM path, and
// the launcher (the GEMMs themselves are in fused_moe_gemm.cu).
//
// Decode path (T * K small): two kernels, no sort kernel. Each CTA finds its slot itself: the
// a-th distinct slot of topk_ids in increasing order (a = blockIdx.y; CTAs past the number of
// distinct slots exit), and the rows (t * K + j) that chose it, from a bitmap in shared memory.
// A CTA owns 16 weight rows of that slot (w13: 8 gate rows and the 8 up rows with the same
// index, so SiLU·mul happens in registers; w2: 16 output columns) and runs mma.sync m16n8k16
// with the weights as the A operand and the slot's tokens as B (8 per MMA tile): the weights
// stream from HBM once, straight into registers (16-byte loads, D k steps per load group),
// however many tokens share the slot. A thread's fragment holds k positions {2c, 2c+1, 2c+8,
// 2c+9}; the dot product may visit k in any order, so k step (u, h) of lane c's quad is fed
// elements 32u + 8c + 4h + {0..3} of the 128-element k chunk (word_k: a quad's four lanes read 64
// contiguous bytes of a row per load, whole sectors), and one 16-byte load of a weight row (or
// of a token's row) serves two k steps. The block's four warps split K; their partial
// sums meet in shared memory in a fixed order. w2's CTAs find their slot and issue their first
// weight loads before the PDL wait (the ids were complete before the w13 kernel triggered its
// dependents), and the last CTA of each 16-column chunk (a ticket per chunk, zeroed by the w13
// kernel) sums every token's K rows in j order into out. GPT-OSS's experts take a second
// instantiation (kExt): w13's epilogue adds the gate/up biases and applies SiLU·mul or the
// clamped SwiGLU, w2's adds the output bias to y. MXFP4 experts (W4A16) take a third (kQ kQMx,
// with the extended epilogue): a lane's k step is one 32-value group of each of its rows, 16 bytes
// and a scale byte, expanded to BF16 (mxfp4_expand, fused_moe.cuh) just before its MMAs; a load
// group is twice as many k steps. FP8 experts (W8A16, kQF8) likewise: a lane's k step is 32
// consecutive e4m3 codes of each row (32 bytes) and the F32 scale of their block (a block spans
// whole 32-value runs: fp8_bk % 64 == 0), expanded by fp8_expand. (A persistent variant, every CTA
// sorting the routing once and each warp streaming its items with three k steps in flight
// across item boundaries, ran slower on the H200: docs/performance.md.)
//
// Grouped-GEMM path: one CTA sorts the rows by slot (counts, a scan of the per-slot tiles of
// 64 or 128 rows, then a scatter) into a tile table; the two GEMMs run over it; the combine sums
// each token's K rows of y in j order. Grids depend on T, K, S, H and I only.
#include <algorithm>
#include <atomic>
#include <climits>
#include <type_traits>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/fused_moe.cuh"
#include "kernels/cuda/launch_moe_quant.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/moe_dense.h"

namespace atom::kernels::cuda {

using moe::fp8_expand;
using moe::fp8_scale_index;
using moe::kMaxTileRows;
using moe::kMinTileRows;
using moe::kQF8;
using moe::kQMx;
using moe::kQNone;
using moe::mxfp4_expand;

namespace {

// ---------------------------------------------------------------- workspace layout
struct Layout {
  // decode path
  int64_t dec_act = 0, dec_y = 0, dec_cnt = 0, dec_end = 0;
  // grouped-GEMM path
  int64_t rows = 0, tile_e = 0, tile_n = 0, ntiles = 0, act = 0, y = 0, gemm_end = 0;
  int64_t P = 0, MT = 0;
  // per-slot dense path (after the grouped path's regions): a chunk of gathered rows x [C, H]
  // (reused for w2's outputs) and their gate | up products [C, 2I]
  int64_t dense_x = 0, dense_h = 0, dense_end = 0, C = 0;
};

int64_t align256(int64_t v) { return (v + 255) / 256 * 256; }

constexpr int kDecRowsPerCta = 16;  // output columns of a w2 decode item (a ticket chunk)

Layout layout(int64_t T, int K, int S, int64_t H, int64_t I, int eb) {
  Layout L;
  const int64_t R = T * K, A = std::min<int64_t>(S, R);
  int64_t o = 0;
  L.dec_act = o;
  o = align256(o + R * I * eb);
  L.dec_y = o;
  o = align256(o + R * H * 4);
  L.dec_cnt = o;
  o = align256(o + (H + kDecRowsPerCta - 1) / kDecRowsPerCta * 4);
  L.dec_end = o;
  // Σ ceil(c_e / B) <= floor(R / B) + (slots in use) tiles of B rows; room for B = 64 tiles and
  // for the sorted positions of B = 128 ones
  L.MT = R / kMinTileRows + A + 1;
  L.P = (R / kMaxTileRows + A + 1) * kMaxTileRows;
  o = 0;
  L.rows = o;
  o = align256(o + L.P * 4);
  L.tile_e = o;
  o = align256(o + L.MT * 4);
  L.tile_n = o;
  o = align256(o + L.MT * 4);
  L.ntiles = o;
  o = align256(o + 4);
  L.act = o;
  o = align256(o + L.P * I * eb);
  L.y = o;
  o = align256(o + R * H * eb);
  L.gemm_end = o;
  if (R >= kMoeDenseMinRoutedRows) {
    L.C = moe_dense_chunk_rows(R, H, I, eb);
    L.dense_x = o;
    o = align256(o + L.C * H * eb);
    L.dense_h = o;
    o = align256(o + L.C * 2 * I * eb);
    L.dense_end = o;
  }
  return L;
}

// ---------------------------------------------------------------- decode path
constexpr int kDecWarps = 4;
constexpr int kDecThreads = kDecWarps * 32;
constexpr int kDecMaxRows = kMoeDecodeMaxRowsCap;
constexpr int kWords = 4;              // 16-byte words per lane per weight row per k step
constexpr int kStep = 4 * kWords * 8;  // k elements per warp step (a quad of lanes)
constexpr int kMaxNT = 4;              // 8-token MMA tiles per pass

struct DecodeArgs {
  MoeLaunch m;
  MoeQuantScales mx;  // MXFP4 or FP8 experts: their scales (else null)
  void* act;          // [T * K, I] of m.type
  float* y;           // [T * K, H]
  int* counters;      // [ceil(H / 16)] tickets of w2's column chunks
  int n_counters;
};

struct DecodeShared {
  uint32_t used[kMoeMaxSlots / 32];
  int ids[kDecMaxRows];
  int rows[kDecMaxRows];
  float part[kDecWarps][kMaxNT][32][4];
  int e, n_active, cnt, last;
};

// This CTA's slot: the a-th distinct valid slot of ids (increasing), -1 past the last; its rows
// (t * K + j, increasing) in sh.rows, their count in sh.cnt, the distinct slots in sh.n_active.
__device__ void decode_route(const MoeLaunch& m, int a, DecodeShared& sh) {
  const int tid = threadIdx.x;
  const int R = static_cast<int>(m.T * m.K), W = (m.S + 31) / 32;
  for (int i = tid; i < W; i += kDecThreads) sh.used[i] = 0;
  __syncthreads();
  for (int r = tid; r < R; r += kDecThreads) {
    const int e = m.ids[r];
    sh.ids[r] = e;
    if (e >= 0 && e < m.S) atomicOr(&sh.used[e >> 5], 1u << (e & 31));
  }
  __syncthreads();
  if (tid < 32) {
    const int lane = tid;
    int e = -1, before = 0;
#pragma unroll
    for (int q = 0; q < kMoeMaxSlots / 32 / 32; ++q) {
      const int wi = lane + 32 * q;
      const uint32_t bits = wi < W ? sh.used[wi] : 0u;
      const int c = __popc(bits);
      int incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const int excl = before + incl - c;
      if (a >= excl && a < excl + c) {
        uint32_t b = bits;
        for (int j = 0; j < a - excl; ++j) b &= b - 1;
        e = wi * 32 + __ffs(static_cast<int>(b)) - 1;
      }
      before += __shfl_sync(0xffffffffu, incl, 31);
    }
    e = __reduce_max_sync(0xffffffffu, e);
    int n = 0;
    if (e >= 0) {
      for (int base = 0; base < R; base += 32) {
        const int r = base + lane;
        const bool hit = r < R && sh.ids[r] == e;
        const uint32_t b = __ballot_sync(0xffffffffu, hit);
        if (hit) sh.rows[n + __popc(b & ((1u << lane) - 1u))] = r;
        n += __popc(b);
      }
    }
    if (lane == 0) {
      sh.e = e;
      sh.n_active = before;
      sh.cnt = n;
    }
  }
  __syncthreads();
}

// The first k (within a k step) of word u of a lane of quad position c. 16-bit weights: the quad's
// four lanes read 64 contiguous bytes of a row per word (u * 32 + c * 8), so every load
// instruction uses whole 32-byte sectors. MXFP4 and FP8: lane c's k step is the 32-value run c,
// whose expansion gives words of 8 consecutive values (c * 32 + u * 8). The dot product may visit k
// in any order, as long as a lane's weight word and its token word cover the same k.
__device__ __forceinline__ int word_k(int c, int u, bool mx) {
  return mx ? c * 32 + u * 8 : u * 32 + c * 8;
}

// Loads the weight words of k steps [st, st + D) (those below s1) of this lane's two rows.
// kQMx: a k step of a lane is one 32-value MXFP4 group of each row: its 16 bytes go to
// w[dd][r][0] and its scale to w[dd][r][1].x, expanded to BF16 where decode_mma uses them.
// kQF8: 32 e4m3 codes of each row, in w[dd][r][0] and [1], and their block's F32 scale in
// w[dd][r][2].x.
template <typename T, bool kW13, int D, int kQ>
__device__ __forceinline__ void decode_load_weights(const DecodeArgs& d, int e, int st, int s1,
                                                    uint4 (&w)[D][2][kWords]) {
  const MoeLaunch& m = d.m;
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  if constexpr (kQ == kQF8) {
    int64_t row0, row1, R, Kd;
    bool v0 = true, v1 = true;
    const uint8_t* base;
    const float* sb;
    if (kW13) {
      row0 = static_cast<int64_t>(blockIdx.x) * 8 + g;
      row1 = m.I + row0;
      R = 2 * m.I;
      Kd = m.H;
      base = static_cast<const uint8_t*>(m.w13);
      sb = static_cast<const float*>(d.mx.s13);
    } else {
      const int64_t h0 = static_cast<int64_t>(blockIdx.x) * 16 + g, h1 = h0 + 8;
      v0 = h0 < m.H;
      v1 = h1 < m.H;
      row0 = v0 ? h0 : 0;
      row1 = v1 ? h1 : 0;
      R = m.H;
      Kd = m.I;
      base = static_cast<const uint8_t*>(m.w2);
      sb = static_cast<const float*>(d.mx.s2);
    }
    const int bn = d.mx.fp8_bn, bk = d.mx.fp8_bk;
    const int64_t gk = bk ? (Kd + bk - 1) / bk : 1, gr = (R + bn - 1) / bn;
    base += static_cast<int64_t>(e) * R * Kd;
    sb += static_cast<int64_t>(e) * gr * gk;
    const uint8_t* r0 = base + row0 * Kd;
    const uint8_t* r1 = base + row1 * Kd;
#pragma unroll
    for (int dd = 0; dd < D; ++dd) {
      const int64_t k = static_cast<int64_t>(st + dd) * kStep + c * 32;
      const bool in = st + dd < s1 && k < Kd;
      const bool i0 = in && v0, i1 = in && v1;
      const uint4 z = make_uint4(0, 0, 0, 0);
      w[dd][0][0] = i0 ? __ldcs(reinterpret_cast<const uint4*>(r0 + k)) : z;
      w[dd][0][1] = i0 ? __ldcs(reinterpret_cast<const uint4*>(r0 + k + 16)) : z;
      w[dd][1][0] = i1 ? __ldcs(reinterpret_cast<const uint4*>(r1 + k)) : z;
      w[dd][1][1] = i1 ? __ldcs(reinterpret_cast<const uint4*>(r1 + k + 16)) : z;
      w[dd][0][2].x = i0 ? __float_as_uint(__ldg(sb + fp8_scale_index(row0, k, bn, bk, gk))) : 0u;
      w[dd][1][2].x = i1 ? __float_as_uint(__ldg(sb + fp8_scale_index(row1, k, bn, bk, gk))) : 0u;
    }
    return;
  }
  if constexpr (kQ == kQMx) {
    const uint8_t* r0;
    const uint8_t* r1;
    const uint8_t* q0;  // the rows' scales of group 0; group stride gs
    const uint8_t* q1;
    bool v0 = true, v1 = true;
    int64_t Kd, gs;
    if (kW13) {
      const int64_t i = static_cast<int64_t>(blockIdx.x) * 8 + g;
      r0 = static_cast<const uint8_t*>(m.w13) + (static_cast<int64_t>(e) * 2 * m.I + i) * (m.H / 2);
      r1 = r0 + m.I * (m.H / 2);
      gs = 2 * m.I;
      q0 = static_cast<const uint8_t*>(d.mx.s13) + static_cast<int64_t>(e) * (m.H / 32) * gs + i;
      q1 = q0 + m.I;
      Kd = m.H;
    } else {
      const int64_t h0 = static_cast<int64_t>(blockIdx.x) * 16 + g, h1 = h0 + 8;
      v0 = h0 < m.H;
      v1 = h1 < m.H;
      const uint8_t* base =
          static_cast<const uint8_t*>(m.w2) + static_cast<int64_t>(e) * m.H * (m.I / 2);
      r0 = base + (v0 ? h0 : 0) * (m.I / 2);
      r1 = base + (v1 ? h1 : 0) * (m.I / 2);
      gs = m.H;
      const uint8_t* sb =
          static_cast<const uint8_t*>(d.mx.s2) + static_cast<int64_t>(e) * (m.I / 32) * gs;
      q0 = sb + (v0 ? h0 : 0);
      q1 = sb + (v1 ? h1 : 0);
      Kd = m.I;
    }
#pragma unroll
    for (int dd = 0; dd < D; ++dd) {
      const int64_t k = static_cast<int64_t>(st + dd) * kStep + c * 32;
      const bool in = st + dd < s1 && k < Kd;
      w[dd][0][0] =
          in && v0 ? __ldcs(reinterpret_cast<const uint4*>(r0 + k / 2)) : make_uint4(0, 0, 0, 0);
      w[dd][1][0] =
          in && v1 ? __ldcs(reinterpret_cast<const uint4*>(r1 + k / 2)) : make_uint4(0, 0, 0, 0);
      w[dd][0][1].x = in && v0 ? __ldg(q0 + (k / 32) * gs) : 0u;
      w[dd][1][1].x = in && v1 ? __ldg(q1 + (k / 32) * gs) : 0u;
    }
    return;
  }
  const T* r0;
  const T* r1;
  bool v0 = true, v1 = true;
  int64_t Kd;
  if (kW13) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * 8 + g;
    r0 = static_cast<const T*>(m.w13) + (static_cast<int64_t>(e) * 2 * m.I + i) * m.H;
    r1 = r0 + m.I * m.H;
    Kd = m.H;
  } else {
    const int64_t h0 = static_cast<int64_t>(blockIdx.x) * 16 + g, h1 = h0 + 8;
    v0 = h0 < m.H;
    v1 = h1 < m.H;
    r0 = static_cast<const T*>(m.w2) + (static_cast<int64_t>(e) * m.H + (v0 ? h0 : 0)) * m.I;
    r1 = static_cast<const T*>(m.w2) + (static_cast<int64_t>(e) * m.H + (v1 ? h1 : 0)) * m.I;
    Kd = m.I;
  }
#pragma unroll
  for (int dd = 0; dd < D; ++dd)
#pragma unroll
    for (int u = 0; u < kWords; ++u) {
      const int64_t k = static_cast<int64_t>(st + dd) * kStep + word_k(c, u, false);
      const bool in = st + dd < s1 && k < Kd;
      w[dd][0][u] =
          in && v0 ? __ldcs(reinterpret_cast<const uint4*>(r0 + k)) : make_uint4(0, 0, 0, 0);
      w[dd][1][u] =
          in && v1 ? __ldcs(reinterpret_cast<const uint4*>(r1 + k)) : make_uint4(0, 0, 0, 0);
    }
}

// The 16 weight rows of the CTA against the slot's tokens, in passes of 8 * NT tokens; calls
// epilogue(q0, ncols, acc) in warp 0 with the K-summed accumulators of each pass (q0: the
// pass's first row index in sh.rows). kW13: rows g / g + 8 of the tile are gate / up row
// blockIdx.x * 8 + g, K = H, B = x rows; else output columns blockIdx.x * 16 + g (+ 8), K = I,
// B = act rows. The block's warps split K into contiguous ranges of k steps; each loads D steps
// of its two rows at a time. preloaded: the first pass's first group is already in w.
template <typename T, int NT, bool kW13, int D, int kQ, typename Epi>
__device__ __forceinline__ void decode_mma(const DecodeArgs& d, DecodeShared& sh, int e,
                                           uint4 (&w)[D][2][kWords], bool preloaded,
                                           Epi&& epilogue) {
  const MoeLaunch& m = d.m;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
  const int64_t Kd = kW13 ? m.H : m.I;
  const int nsteps = static_cast<int>((Kd + kStep - 1) / kStep);
  const int per = (nsteps + kDecWarps - 1) / kDecWarps;
  const int s0 = warp * per, s1 = min(nsteps, s0 + per);
  const int cnt = sh.cnt;
  constexpr int kPass = 8 * NT;
  const int passes = (cnt + kPass - 1) / kPass;
  for (int p = 0; p < passes; ++p) {
    const int q0 = p * kPass;
    const int ncols = min(kPass, cnt - q0);
    const T* brow[NT];
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) {
      const int q = q0 + tt * 8 + g;
      brow[tt] = nullptr;
      if (q < cnt) {
        const int r = sh.rows[q];
        brow[tt] = kW13 ? static_cast<const T*>(m.x.data) + (r / m.K) * m.x.stride
                        : static_cast<const T*>(d.act) + static_cast<int64_t>(r) * m.I;
      }
    }
    float acc[NT][4];
#pragma unroll
    for (int tt = 0; tt < NT; ++tt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[tt][i] = 0.0f;
    for (int st = s0; st < s1; st += D) {
      if (!(preloaded && p == 0 && st == s0)) decode_load_weights<T, kW13, D, kQ>(d, e, st, s1, w);
#pragma unroll
      for (int dd = 0; dd < D; ++dd) {
        if (st + dd >= s1) break;
        uint4 wr[2][kWords];  // this step's BF16 words of the two rows
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if constexpr (kQ == kQF8) {
            fp8_expand(w[dd][r][0], w[dd][r][1], __uint_as_float(w[dd][r][2].x), wr[r]);
          } else if constexpr (kQ == kQMx) {
            mxfp4_expand(w[dd][r][0], w[dd][r][1].x, wr[r]);
          } else {
#pragma unroll
            for (int u = 0; u < kWords; ++u) wr[r][u] = w[dd][r][u];
          }
        }
        const int64_t kb = static_cast<int64_t>(st + dd) * kStep;
#pragma unroll
        for (int tt = 0; tt < NT; ++tt) {
          if (tt * 8 >= ncols) break;
          uint4 xv[kWords];
#pragma unroll
          for (int u = 0; u < kWords; ++u) {
            const int64_t k = kb + word_k(c, u, kQ != kQNone);
            xv[u] = brow[tt] && k < Kd ? __ldg(reinterpret_cast<const uint4*>(brow[tt] + k))
                                       : make_uint4(0, 0, 0, 0);
          }
#pragma unroll
          for (int u = 0; u < kWords; ++u) {
            const uint4& wa = wr[0][u];
            const uint4& wb = wr[1][u];
            const uint32_t a0[4] = {wa.x, wb.x, wa.y, wb.y};
            const uint32_t a1[4] = {wa.z, wb.z, wa.w, wb.w};
            mma16816<T>(acc[tt], a0, xv[u].x, xv[u].y);
            mma16816<T>(acc[tt], a1, xv[u].z, xv[u].w);
          }
        }
      }
    }
#pragma unroll
    for (int tt = 0; tt < NT; ++tt)
#pragma unroll
      for (int i = 0; i < 4; ++i) sh.part[warp][tt][lane][i] = acc[tt][i];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int tt = 0; tt < NT; ++tt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float v = sh.part[0][tt][lane][i];
#pragma unroll
          for (int ww = 1; ww < kDecWarps; ++ww) v += sh.part[ww][tt][lane][i];
          acc[tt][i] = v;
        }
      epilogue(q0, ncols, acc);
    }
    __syncthreads();
  }
}

template <typename T, int NT, int D, bool kExt, int kQ>
__global__ void __launch_bounds__(kDecThreads) moe_decode_w13_kernel(DecodeArgs d) {
  __shared__ DecodeShared sh;
  pdl_wait();               // topk_ids come from the router
  pdl_launch_dependents();  // after the wait: the w2 kernel reads the ids before its own wait
  if (blockIdx.x == 0 && blockIdx.y == 0)
    for (int i = threadIdx.x; i < d.n_counters; i += kDecThreads) d.counters[i] = 0;
  decode_route(d.m, static_cast<int>(blockIdx.y), sh);
  const int e = sh.e;
  if (e < 0) return;
  uint4 w[D][2][kWords];
  const int lane = threadIdx.x & 31, c = lane & 3;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 8 + (lane >> 2);
  T* act = static_cast<T*>(d.act);
  const int64_t I = d.m.I;
  decode_mma<T, NT, true, D, kQ>(d, sh, e, w, false, [&](int q0, int ncols, float(&acc)[NT][4]) {
    // acc[tt]: gate (i, tokens 2c, 2c + 1), up (i, tokens 2c, 2c + 1)
    [[maybe_unused]] float bg = 0.0f, bu = 0.0f;
    if (kExt && d.m.b13) {
      const T* b = static_cast<const T*>(d.m.b13) + static_cast<int64_t>(e) * 2 * I;
      bg = to_float<T>(b[i]);
      bu = to_float<T>(b[I + i]);
    }
#pragma unroll
    for (int tt = 0; tt < NT; ++tt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = tt * 8 + 2 * c + h;
        if (col < ncols) {
          const int r = sh.rows[q0 + col];
          float v;
          if constexpr (kExt) {
            const float gt = acc[tt][h] + bg, up = acc[tt][2 + h] + bu;
            v = moe_act_times(gt, up, d.m.act, d.m.alpha, d.m.limit);
          } else {
            v = silu_times(acc[tt][h], acc[tt][2 + h]);
          }
          act[static_cast<int64_t>(r) * I + i] = from_float<T>(v);
        }
      }
  });
}

// out rows' columns [chunk * 16, chunk * 16 + 16): Σ_j weights[t, j] * y[t * K + j] in j order
// (slots outside [0, S) skipped).
__device__ void decode_combine(const DecodeArgs& d, const DecodeShared& sh, int chunk) {
  const MoeLaunch& m = d.m;
  const int64_t h0 = static_cast<int64_t>(chunk) * kDecRowsPerCta;
  for (int64_t idx = threadIdx.x; idx < m.T * kDecRowsPerCta; idx += kDecThreads) {
    const int64_t t = idx / kDecRowsPerCta, h = h0 + idx % kDecRowsPerCta;
    if (h >= m.H) continue;
    float acc = 0.0f;
    for (int j = 0; j < m.K; ++j) {
      const int64_t r = t * m.K + j;
      const int e = sh.ids[r];
      if (e < 0 || e >= m.S) continue;
      acc += m.weights[r] * __ldcg(d.y + r * m.H + h);
    }
    store_elem(row_of(m.out, t), m.out.type, h, acc);
  }
}

template <typename T, int NT, int D, bool kExt, int kQ>
__global__ void __launch_bounds__(kDecThreads) moe_decode_w2_kernel(DecodeArgs d) {
  __shared__ DecodeShared sh;
  pdl_launch_dependents();
  // The ids were complete before the w13 kernel let this one launch: route before the wait.
  decode_route(d.m, static_cast<int>(blockIdx.y), sh);
  const int e = sh.e;
  if (sh.n_active == 0) {  // no valid slot: out is zero
    if (blockIdx.y != 0) return;
    pdl_wait();
    decode_combine(d, sh, static_cast<int>(blockIdx.x));
    return;
  }
  if (e < 0) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = lane & 3;
  uint4 w[D][2][kWords];
  {  // this warp's first weight group, before the wait (no earlier kernel writes weights)
    const int nsteps = static_cast<int>((d.m.I + kStep - 1) / kStep);
    const int per = (nsteps + kDecWarps - 1) / kDecWarps;
    const int s0 = warp * per, s1 = min(nsteps, s0 + per);
    if (s0 < s1) decode_load_weights<T, false, D, kQ>(d, e, s0, s1, w);
  }
  pdl_wait();  // act comes from the w13 kernel
  const int64_t h0 = static_cast<int64_t>(blockIdx.x) * 16 + (lane >> 2), H = d.m.H;
  decode_mma<T, NT, false, D, kQ>(d, sh, e, w, true, [&](int q0, int ncols, float(&acc)[NT][4]) {
    // acc[tt]: (h0, tokens 2c, 2c + 1), (h0 + 8, tokens 2c, 2c + 1)
    float b0 = 0.0f, b1 = 0.0f;
    if (kExt && d.m.b2) {
      const T* b = static_cast<const T*>(d.m.b2) + static_cast<int64_t>(e) * H;
      if (h0 < H) b0 = to_float<T>(b[h0]);
      if (h0 + 8 < H) b1 = to_float<T>(b[h0 + 8]);
    }
#pragma unroll
    for (int tt = 0; tt < NT; ++tt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = tt * 8 + 2 * c + h;
        if (col < ncols) {
          const int64_t r = sh.rows[q0 + col];
          if (h0 < H) d.y[r * H + h0] = kExt ? acc[tt][h] + b0 : acc[tt][h];
          if (h0 + 8 < H) d.y[r * H + h0 + 8] = kExt ? acc[tt][2 + h] + b1 : acc[tt][2 + h];
        }
      }
  });
  // The last of the n_active CTAs of this column chunk sums the tokens' rows.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) sh.last = atomicAdd(&d.counters[blockIdx.x], 1) == sh.n_active - 1 ? 1 : 0;
  __syncthreads();
  if (!sh.last) return;
  __threadfence();
  decode_combine(d, sh, static_cast<int>(blockIdx.x));
}

template <typename T, int NT, int D, bool kExt, int kQ>
void launch_decode_nt(const DecodeArgs& d, cudaStream_t s) {
  const MoeLaunch& m = d.m;
  const unsigned A = static_cast<unsigned>(std::min<int64_t>(m.S, m.T * m.K));
  launch(moe_decode_w13_kernel<T, NT, D, kExt, kQ>, dim3(static_cast<unsigned>(m.I / 8), A),
         kDecThreads, 0, s, d);
  launch(moe_decode_w2_kernel<T, NT, D, kExt, kQ>, dim3(static_cast<unsigned>(d.n_counters), A),
         kDecThreads, 0, s, d);
}

template <typename T, int D, bool kExt, int kQ>
void launch_decode_depth(const DecodeArgs& d, cudaStream_t s) {
  // Tokens per pass: up to T of them share a slot (the fused shared slots take every token).
  if (d.m.T <= 8)
    launch_decode_nt<T, 1, D, kExt, kQ>(d, s);
  else if (d.m.T <= 16)
    launch_decode_nt<T, 2, D, kExt, kQ>(d, s);
  else
    launch_decode_nt<T, 4, D, kExt, kQ>(d, s);
}

// MXFP4 weights take twice the k steps per load group (a step is 17 bytes of a row, not 64), FP8
// weights 1.5 to 2 times (a step is 36 bytes of a row in 5 registers; 8 steps would hold 144).
template <typename T, bool kExt, int kQ>
void launch_decode_ext(const DecodeArgs& d, cudaStream_t s) {
  if (d.m.decode_depth == 4)
    launch_decode_depth<T, kQ == kQMx ? 8 : kQ == kQF8 ? 6 : 4, kExt, kQ>(d, s);
  else
    launch_decode_depth<T, kQ != kQNone ? 4 : 2, kExt, kQ>(d, s);
}

template <typename T>
void launch_decode(const DecodeArgs& d, cudaStream_t s) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {  // W8A16 and W4A16, every epilogue
    if (d.mx.fp8_bn) return launch_decode_ext<T, true, kQF8>(d, s);
    if (d.mx.s13) return launch_decode_ext<T, true, kQMx>(d, s);
  }
  if (d.m.act != 0 || d.m.b13 || d.m.b2)
    launch_decode_ext<T, true, kQNone>(d, s);
  else
    launch_decode_ext<T, false, kQNone>(d, s);
}

// ---------------------------------------------------------------- grouped-GEMM path
constexpr int kSortThreads = 1024;
static_assert(2 * kSortThreads == kMoeMaxSlots, "the scan takes two slots per thread");

struct SortArgs {
  const int32_t* ids;
  int64_t R;
  int S;
  int bm;  // rows per tile
  int* sorted_rows;
  int* tile_expert;
  int* tile_rows;
  int* num_tiles;
};

// One CTA: counts per slot, an exclusive scan of the slots' tiles, the tile table and the
// padding (-1), then each row's sorted position. Rows of a slot land in any order (shared-memory
// atomics): each output row depends on its own inputs only, so the result does not change.
__global__ void __launch_bounds__(kSortThreads) moe_sort_kernel(SortArgs a) {
  __shared__ int cnt[kMoeMaxSlots], toff[kMoeMaxSlots], cur[kMoeMaxSlots];
  __shared__ int wsum[32];
  pdl_wait();
  pdl_launch_dependents();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e < a.S; e += kSortThreads) {
    cnt[e] = 0;
    cur[e] = 0;
  }
  __syncthreads();
  for (int64_t r = tid; r < a.R; r += kSortThreads) {
    const int e = a.ids[r];
    if (e >= 0 && e < a.S) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  const int e0 = 2 * tid;
  const int t0 = e0 < a.S ? (cnt[e0] + a.bm - 1) / a.bm : 0;
  const int t1 = e0 + 1 < a.S ? (cnt[e0 + 1] + a.bm - 1) / a.bm : 0;
  const int v = t0 + t1;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += x;
  }
  if (lane == 31) wsum[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int s = wsum[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int x = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += x;
    }
    wsum[lane] = s;  // inclusive over warps
  }
  __syncthreads();
  const int excl = (warp > 0 ? wsum[warp - 1] : 0) + incl - v;
  if (e0 < a.S) toff[e0] = excl;
  if (e0 + 1 < a.S) toff[e0 + 1] = excl + t0;
  if (tid == 0) *a.num_tiles = wsum[31];
  __syncthreads();
  for (int e = tid; e < a.S; e += kSortThreads) {
    const int c = cnt[e], nt = (c + a.bm - 1) / a.bm, t = toff[e];
    for (int k = 0; k < nt; ++k) {
      a.tile_expert[t + k] = e;
      a.tile_rows[t + k] = min(a.bm, c - k * a.bm);
    }
    for (int q = c; q < nt * a.bm; ++q) a.sorted_rows[t * a.bm + q] = -1;
  }
  for (int64_t r = tid; r < a.R; r += kSortThreads) {
    const int e = a.ids[r];
    if (e >= 0 && e < a.S)
      a.sorted_rows[toff[e] * a.bm + atomicAdd(&cur[e], 1)] = static_cast<int>(r);
  }
}

// out[t] = Σ_j weights[t, j] * y[t * K + j] (j in order, slots outside [0, S) skipped), eight
// columns per thread.
template <typename Y, typename O, bool kVec>
__global__ void __launch_bounds__(256)
    moe_combine_kernel(Mat out, const Y* y, const int32_t* ids, const float* w, int64_t T, int K,
                       int S, int64_t H) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t HV = H / 8, n = T * HV;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / HV, h = (idx % HV) * 8;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < K; ++j) {
      const int64_t r = t * K + j;
      const int e = ids[r];
      if (e < 0 || e >= S) continue;
      const float wt = w[r];
      float yv[8];
      load_vec<Y, 8>(y + r * H + h, yv);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += wt * yv[i];
    }
    O* o = reinterpret_cast<O*>(row_of(out, t)) + h;
    if constexpr (kVec && sizeof(O) == 4) {
      const float lo[4] = {acc[0], acc[1], acc[2], acc[3]},
                  hi[4] = {acc[4], acc[5], acc[6], acc[7]};
      store_vec<O, 4>(o, lo);
      store_vec<O, 4>(o + 4, hi);
    } else if constexpr (kVec) {
      store_vec<O, 8>(o, acc);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] = from_float<O>(acc[i]);
    }
  }
}

template <typename Y, typename O>
void launch_combine_as(const MoeLaunch& m, const Y* y, int K, cudaStream_t s) {
  const bool vec = m.out.stride % 8 == 0 && reinterpret_cast<uintptr_t>(m.out.data) % 16 == 0;
  const unsigned grid = grid_for(m.T * (m.H / 8), 256);
  if (vec)
    launch(moe_combine_kernel<Y, O, true>, grid, 256, 0, s, m.out, y, m.ids, m.weights, m.T, K, m.S,
           m.H);
  else
    launch(moe_combine_kernel<Y, O, false>, grid, 256, 0, s, m.out, y, m.ids, m.weights, m.T, K,
           m.S, m.H);
}

template <typename Y>
void launch_combine(const MoeLaunch& m, const Y* y, int K, cudaStream_t s) {
  switch (m.out.type) {
    case Elem::kF32:
      return launch_combine_as<Y, float>(m, y, K, s);
    case Elem::kBF16:
      return launch_combine_as<Y, __nv_bfloat16>(m, y, K, s);
    default:
      return launch_combine_as<Y, __half>(m, y, K, s);
  }
}

// The dense path's row moves, 16 bytes a thread (rows are 16-byte aligned, W % 8 == 0):
// kGather: dst[i] = src[rows[i] / K] (x by token), zeros for padding (rows[i] < 0); else
// dst[rows[i]] = src[i] (y by routed row), padding skipped.
template <bool kGather>
__global__ void __launch_bounds__(256)
    moe_rows_copy_kernel(void* dst, int64_t dst_stride, const void* src, int64_t src_stride,
                         const int* rows, int64_t n, int K, int64_t W) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t WV = W / 8, total = n * WV;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx / WV, c = (idx % WV) * 8;
    const int64_t r = rows[i];
    if (!kGather && r < 0) continue;
    const int64_t di = kGather ? i : r, si = kGather ? r / K : i;
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(dst) + di * dst_stride + c) =
        r < 0 ? make_uint4(0, 0, 0, 0)
              : *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(src) +
                                                si * src_stride + c);
  }
}

// The counting sort into the workspace's tables (m.gemm_tile_rows rows a tile), for the grouped
// GEMMs and the per-slot dense path.
SortArgs launch_sort(const MoeLaunch& m, const Layout& L, cudaStream_t s) {
  char* ws = static_cast<char*>(m.workspace);
  SortArgs sa;
  sa.ids = m.ids;
  sa.R = m.T * m.K;
  sa.S = m.S;
  sa.bm = m.gemm_tile_rows;
  sa.sorted_rows = reinterpret_cast<int*>(ws + L.rows);
  sa.tile_expert = reinterpret_cast<int*>(ws + L.tile_e);
  sa.tile_rows = reinterpret_cast<int*>(ws + L.tile_n);
  sa.num_tiles = reinterpret_cast<int*>(ws + L.ntiles);
  launch(moe_sort_kernel, 1, kSortThreads, 0, s, sa);
  return sa;
}

template <typename T>
void launch_gemm_path(const MoeLaunch& m, const MoeQuantScales& mx, const Layout& L,
                      cudaStream_t s) {
  char* ws = static_cast<char*>(m.workspace);
  const SortArgs sa = launch_sort(m, L, s);
  moe::GemmArgs g;
  g.sorted_rows = sa.sorted_rows;
  g.tile_expert = sa.tile_expert;
  g.tile_rows = sa.tile_rows;
  g.num_tiles = sa.num_tiles;
  g.H = m.H;
  g.I = m.I;
  g.K = m.K;
  g.max_tiles =
      static_cast<int>(m.T * m.K / m.gemm_tile_rows + std::min<int64_t>(m.S, m.T * m.K) + 1);
  g.tile_rows_cap = m.gemm_tile_rows;
  T* act = reinterpret_cast<T*>(ws + L.act);
  T* y = reinterpret_cast<T*>(ws + L.y);
  g.a = m.x.data;
  g.a_stride = m.x.stride;
  g.w = m.w13;
  g.scales = mx.s13;
  g.fp8_bn = mx.fp8_bn;
  g.fp8_bk = mx.fp8_bk;
  g.out = act;
  g.bias = m.b13;
  g.act = m.act;
  g.alpha = m.alpha;
  g.limit = m.limit;
  moe::launch_moe_gemm_w13(g, m.type, s);
  g.a = act;
  g.a_stride = m.I;
  g.w = m.w2;
  g.scales = mx.s2;
  g.out = y;
  g.bias = m.b2;
  g.act = 0;
  moe::launch_moe_gemm_w2(g, m.type, s);
  launch_combine<T>(m, y, m.K, s);
}

template <typename T>
void launch_typed(const MoeLaunch& m, const MoeQuantScales& mx, cudaStream_t s) {
  const Layout L = layout(m.T, m.K, m.S, m.H, m.I, 2);
  if (m.K == 0 || m.S == 0) {  // nothing routed: zeros
    launch_combine<T>(m, static_cast<const T*>(nullptr), 0, s);
    return;
  }
  if (m.decode) {
    char* ws = static_cast<char*>(m.workspace);
    DecodeArgs d;
    d.m = m;
    d.mx = mx;
    d.act = ws + L.dec_act;
    d.y = reinterpret_cast<float*>(ws + L.dec_y);
    d.counters = reinterpret_cast<int*>(ws + L.dec_cnt);
    d.n_counters = static_cast<int>((m.H + kDecRowsPerCta - 1) / kDecRowsPerCta);
    launch_decode<T>(d, s);
  } else {
    launch_gemm_path<T>(m, mx, L, s);
  }
}

}  // namespace

int64_t moe_workspace_bytes(int64_t T, int K, int S, int64_t H, int64_t I, int elem_bytes) {
  if (T <= 0 || K <= 0) return 0;
  const Layout L = layout(T, K, S, H, I, elem_bytes);
  const bool decode_possible = T * K <= kMoeDecodeMaxRowsCap;
  return std::max({decode_possible ? L.dec_end : 0, L.gemm_end, L.dense_end});
}

MoeDense moe_dense_begin(const MoeLaunch& m, cudaStream_t s) {
  const Layout L = layout(m.T, m.K, m.S, m.H, m.I, 2);
  char* ws = static_cast<char*>(m.workspace);
  const SortArgs sa = launch_sort(m, L, s);
  MoeDense d;
  d.sorted_rows = sa.sorted_rows;
  d.tile_expert = sa.tile_expert;
  d.tile_rows = sa.tile_rows;
  d.num_tiles = sa.num_tiles;
  d.max_tiles = L.MT;
  d.tile = m.gemm_tile_rows;
  d.act = ws + L.act;
  d.y = ws + L.y;
  d.x_chunk = ws + L.dense_x;
  d.h_chunk = ws + L.dense_h;
  d.chunk_rows = L.C;
  return d;
}

void moe_dense_gather(const MoeLaunch& m, const MoeDense& d, int64_t first, int64_t n,
                      cudaStream_t s) {
  if (n <= 0) return;
  const unsigned grid = grid_for(n * (m.H / 8), 256);
  launch(moe_rows_copy_kernel<true>, grid, 256, 0, s, d.x_chunk, m.H,
         static_cast<const void*>(m.x.data), m.x.stride, d.sorted_rows + first, n, m.K, m.H);
}

void moe_dense_scatter(const MoeLaunch& m, const MoeDense& d, int64_t first, int64_t n,
                       cudaStream_t s) {
  if (n <= 0) return;
  const unsigned grid = grid_for(n * (m.H / 8), 256);
  launch(moe_rows_copy_kernel<false>, grid, 256, 0, s, d.y, m.H,
         static_cast<const void*>(d.x_chunk), m.H, d.sorted_rows + first, n, m.K, m.H);
}

void moe_dense_combine(const MoeLaunch& m, const MoeDense& d, cudaStream_t s) {
  if (m.type == Elem::kBF16)
    launch_combine<__nv_bfloat16>(m, static_cast<const __nv_bfloat16*>(d.y), m.K, s);
  else
    launch_combine<__half>(m, static_cast<const __half*>(d.y), m.K, s);
}

void launch_fused_moe(const MoeLaunch& m, cudaStream_t s) {
  if (m.T <= 0) return;
  if (m.type == Elem::kBF16)
    launch_typed<__nv_bfloat16>(m, MoeQuantScales{}, s);
  else
    launch_typed<__half>(m, MoeQuantScales{}, s);
}

void launch_fused_moe_quant(const MoeLaunch& m, const MoeQuantScales& scales, cudaStream_t s) {
  if (m.T <= 0) return;
  launch_typed<__nv_bfloat16>(m, scales, s);  // BF16 activations only (checked by the caller)
}

}  // namespace atom::kernels::cuda
