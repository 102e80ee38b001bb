// Prefill attention on Hopper's warpgroup MMA (wgmma). A CTA of NWG warpgroups owns 64 * NWG
// packed query rows (row = token * G + head_in_group, as in attention.cu) of one (sequence, kv
// head); each warpgroup computes S = Q Kᵀ for its 64 rows over a BN-key tile with both operands in
// shared memory, runs the online softmax in registers, and accumulates O += P V with P taken
// straight from the S accumulators (their register layout is wgmma's A-operand layout) and V
// read transposed (MN-major) from shared memory. K/V tiles are gathered from the paged cache
// with cp.async into two stages laid out as wgmma's 128-byte-swizzled canonical tiles:
// [head_dim / 64][rows][64], row r's 16-byte chunk c stored at chunk c ^ (r % 8).
// BF16/F16 caches: kPipe = 0 is the serial loop (each GEMM waited before the softmax that
// follows); kPipe 2 and 3 overlap each tile's softmax with the previous tile's P V product, with
// K one tile ahead of V in two stages (2) or K and V tiles together in three (3). Each thread
// looks a key's page up once for both K and V.
// kPipe 4 (warp-specialized, FlashAttention-3's recipe; two warpgroups only): a third warpgroup,
// the producer, with its registers cut by setmaxnreg, gathers Q and the K/V tiles with cp.async
// into rings of kWsStages stages, each stage announced on a "full" mbarrier
// (cp.async.mbarrier.arrive) and handed back on an "empty" one once the consumers' wgmma reading
// it has retired; the two consumer warpgroups run kPipe 2's loop with mbarrier waits in place of
// the per-tile __syncthreads. K runs one tile ahead of V (rings of their own), so Q K_t can start
// while V_{t-1} is still arriving. kPipe 5 adds FlashAttention-3's ping-pong: the two consumer
// warpgroups take turns issuing their GEMMs (two named barriers), so one's softmax runs while the
// other's GEMMs occupy the tensor cores. kPipe 6 (the default) is kPipe 5 with two row tiles per
// CTA, the longest and the shortest of a (sequence, kv head) (causal: about equal work per CTA):
// the rings' phases run on into the second tile, whose Q and first K tiles load under the
// first's last P V product and output, so half the CTAs pay their start-up and drain.
// FP8 (e4m3) caches (kFp8): the e4m3 tiles arrive with cp.async in two stages of their own and
// every thread then converts its share into one canonical tile of q's type (exact), which costs a
// second barrier per tile; the scales fold into the softmax scale (k) and the output (v).
#include <atomic>
#include <cstdlib>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace atom::kernels::cuda {

namespace {

template <int D, int NWG, int BN, bool kFp8, int kPipe>
constexpr size_t wgmma_smem_bytes() {
  if constexpr (kFp8)  // Q, one converted K/V tile, two stages of e4m3 K/V
    return static_cast<size_t>(64 * NWG * D + 2 * BN * D) * 2 + 4 * BN * D + 1024;
  constexpr int stages = kPipe == 3 ? 3 : 2;
  constexpr size_t barriers = kPipe >= 4 ? 128 : 0;  // kPipe 4-6's mbarriers
  constexpr size_t slack = 1024;                     // for the 1024-byte alignment
  return static_cast<size_t>(64 * NWG * D + 2 * stages * BN * D) * 2 + barriers + slack;
}

template <typename T, int N>
__device__ __forceinline__ void qk_mma(float (&s)[N / 2], uint64_t da, uint64_t db, int scale_d) {
  if constexpr (N == 128)
    wgmma_m64n128k16_ss<T>(s, da, db, scale_d);
  else
    wgmma_m64n64k16_ss<T>(s, da, db, scale_d);
}

// Element offset of 16-byte chunk c of row `row` in a [D / 64][rows][64] swizzled tile.
__device__ __forceinline__ int tile_offset(int rows, int row, int c) {
  return (c >> 3) * rows * 64 + row * 64 + (((c & 7) ^ (row & 7)) << 3);
}

template <typename T, int D>
__device__ __forceinline__ void pv_mma(float (&o)[D / 2], const uint32_t (&a)[4], uint64_t desc);
template <>
__device__ __forceinline__ void pv_mma<__nv_bfloat16, 128>(float (&o)[64], const uint32_t (&a)[4],
                                                           uint64_t desc) {
  wgmma_m64n128k16_rs<__nv_bfloat16>(o, a, desc, 1);
}
template <>
__device__ __forceinline__ void pv_mma<__nv_bfloat16, 64>(float (&o)[32], const uint32_t (&a)[4],
                                                          uint64_t desc) {
  wgmma_m64n64k16_rs<__nv_bfloat16>(o, a, desc, 1);
}
template <>
__device__ __forceinline__ void pv_mma<__half, 128>(float (&o)[64], const uint32_t (&a)[4],
                                                    uint64_t desc) {
  wgmma_m64n128k16_rs<__half>(o, a, desc, 1);
}
template <>
__device__ __forceinline__ void pv_mma<__half, 64>(float (&o)[32], const uint32_t (&a)[4],
                                                   uint64_t desc) {
  wgmma_m64n64k16_rs<__half>(o, a, desc, 1);
}

// kPipe 4-6: K/V stages per ring, and the registers per thread setmaxnreg gives the producer and
// each consumer warpgroup: 128 * 40 + 256 * 232 = 64,512, all of a 384-thread CTA's 168 per
// thread (ptxas allocates that many at launch); the producer spilled with 24.
constexpr int kWsStages = 2;
constexpr int kWsProducerRegs = 40, kWsConsumerRegs = 232;
// kPipe 6 (two work tiles per CTA): the producer gets 56 registers and the consumers 224
// (128 * 56 + 256 * 224 = 64,512); with kPipe 5's 40 / 232 it ran 5-12% slower on the H200.
template <int kPipe>
constexpr int producer_regs() {
  return kPipe == 6 ? 56 : kWsProducerRegs;
}
template <int kPipe>
constexpr int consumer_regs() {
  return kPipe == 6 ? 224 : kWsConsumerRegs;
}

template <typename T, int D, int NWG, int kBN, bool kFp8, int kPipe>
__global__ void __launch_bounds__(128 * NWG + (kPipe >= 4 ? 128 : 0), NWG == 1 ? 2 : 1)
    wgmma_attention_kernel(AttnLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  constexpr bool kWs = kPipe >= 4;  // warp-specialized: warpgroup 0 loads, the others compute
  constexpr bool kPingPong = kPipe >= 5;
  constexpr bool kPersist = kPipe == 6;  // a CTA walks two work tiles
  static_assert(!kWs || (NWG == 2 && !kFp8), "kPipe 4-6: two consumer warpgroups, BF16/F16");
  // kThreads compute; kLoadThreads issue the cp.async copies.
  constexpr int kBM = 64 * NWG, kThreads = 128 * NWG, kLoadThreads = kWs ? 128 : kThreads;
  constexpr int NT = kBN / 8;  // 8-key blocks of S per tile
  constexpr int DT = D / 8;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  static_assert(!kFp8 || kPipe == 0, "the FP8 cache keeps the serial loop");
  // Canonical K/V tiles (per ring).
  constexpr int kStages = kFp8 ? 1 : kPipe == 3 ? 3 : kWs ? kWsStages : 2;
  T* sQ = reinterpret_cast<T*>(base);  // [D/64][kBM][64]
  T* sK = sQ + kBM * D;                // [kStages][D/64][kBN][64]
  T* sV = sK + kStages * kBN * D;      // [kStages][D/64][kBN][64]
  // FP8: [2][K, V][kBN][D] e4m3 stages
  uint8_t* sRaw = reinterpret_cast<uint8_t*>(sV + kStages * kBN * D);

  // kPipe 4/5: the producer's threads and the consumers' each count from 0.
  const bool producer = kWs && threadIdx.x < 128;
  const int tid = kWs && !producer ? threadIdx.x - 128 : threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
  constexpr int DC = D / 8;  // 16-byte chunks per row
  const T* qg = static_cast<const T*>(a.q);
  const T* kc = static_cast<const T*>(a.k_cache);
  const T* vc = static_cast<const T*>(a.v_cache);
  // BF16/F16: thread tid copies 16-byte chunk kv_c of a K/V tile's rows kv_r0 + kRowsPass * p.
  const int kv_c = tid % DC, kv_r0 = tid / DC;
  // The CTA's rows and keys (the work tile), its sequence's pages and its kv head's K/V columns.
  CtaRange r;
  const int32_t* pages;
  const T *kcol, *vcol;
  auto set_tile = [&](int mtile, int seq_head) {
    r = cta_range(a, mtile, seq_head, kBM, kBN);
    pages = a.page_indices + a.page_indptr[r.s];
    kcol = kc + r.kh * D + kv_c * 8;
    vcol = vc + r.kh * D + kv_c * 8;
  };
  // kPersist: CTA (x, y) takes row tile m_tiles - 1 - x of (sequence, kv head) y, then row tile
  // x (causal: a tile's keys grow with its rows, so every CTA gets about the same work, the
  // longest first), the second's Q and first K tiles loading under the first's last P V product
  // and output. Tiles past their sequence's rows (shorter sequences of the batch) are skipped.
  const int m_tiles = (a.max_query_len * (a.num_heads / a.num_kv_heads) + kBM - 1) / kBM;
  int pass = 0;
  // The next non-empty work tile into r; false when none is left.
  auto next_work = [&] {
    const int x = static_cast<int>(blockIdx.x);
    for (; pass < 2; ++pass) {
      const int mt = pass == 0 ? m_tiles - 1 - x : x;
      if (pass == 1 && mt >= m_tiles - 1 - x) return false;
      set_tile(mt, static_cast<int>(blockIdx.y));
      if (r.m0 < r.rows) {
        ++pass;
        return true;
      }
    }
    return false;
  };
  if constexpr (kPersist) {
    if (!next_work()) return;
  } else {
    // Long row tiles first (causal: a tile's keys grow with its rows). The hardware starts CTAs
    // in blockIdx order, x fastest: by default each (sequence, kv head)'s row tiles run together,
    // so its K/V tiles stay in L2 while they are read; with a.longest_first_across (a grid of a
    // few waves) the order is by length over all of them, which balances the SMs' work.
    int mtile = static_cast<int>(gridDim.x - 1 - blockIdx.x),
        seq_head = static_cast<int>(blockIdx.y);
    if (a.longest_first_across) {
      const int L = static_cast<int>(blockIdx.x + gridDim.x * blockIdx.y),
                n = static_cast<int>(gridDim.y);
      mtile = static_cast<int>(gridDim.x) - 1 - L / n;
      seq_head = L % n;
    }
    set_tile(mtile, seq_head);
    if (r.m0 >= r.rows) return;
  }
  auto load_q = [&] {
    for (int idx = tid; idx < kBM * DC; idx += kLoadThreads) {
      const int row = idx / DC, c = idx % DC;
      const T* src = q_chunk<D>(a, r, qg, row, c);
      cp_async16(smem_addr(sQ + tile_offset(kBM, row, c)), src ? src : qg, src != nullptr);
    }
  };
  if constexpr (!kWs) load_q();
  // FP8: the e4m3 rows as they are, into raw stage `stage`.
  auto load_kv_fp8 = [&](int tile, int stage) {
    const int n0 = r.kv_begin + tile * kBN;
    constexpr int RC = D / 16;
    uint8_t* dk = sRaw + stage * 2 * kBN * D;
    uint8_t* dv = dk + kBN * D;
    const uint8_t* kc8 = static_cast<const uint8_t*>(a.k_cache);
    const uint8_t* vc8 = static_cast<const uint8_t*>(a.v_cache);
    for (int idx = tid; idx < kBN * RC; idx += kThreads) {
      const int row = idx / RC, c = idx % RC;
      const int j = n0 + row;
      const bool valid = j < r.kv_end;
      const int64_t off = valid ? kv_row_offset(a, pages, j, r.kh) + c * 16 : 0;
      cp_async16(smem_addr(dk + idx * 16), kc8 + off, valid);
      cp_async16(smem_addr(dv + idx * 16), vc8 + off, valid);
    }
  };
  // FP8: raw stage `stage` -> the canonical tiles; raw chunk c of a row is tile chunks 2c, 2c+1.
  auto convert_kv = [&](int stage) {
    constexpr int RC = D / 16;
    const uint8_t* rk = sRaw + stage * 2 * kBN * D;
    const uint8_t* rv = rk + kBN * D;
    for (int idx = tid; idx < kBN * RC; idx += kThreads) {
      const int row = idx / RC, c = idx % RC;
      const uint4 xk = *reinterpret_cast<const uint4*>(rk + idx * 16);
      const uint4 xv = *reinterpret_cast<const uint4*>(rv + idx * 16);
      *reinterpret_cast<uint4*>(sK + tile_offset(kBN, row, 2 * c)) = make_uint4(
          fp8x2_to<T>(xk.x), fp8x2_to<T>(xk.x >> 16), fp8x2_to<T>(xk.y), fp8x2_to<T>(xk.y >> 16));
      *reinterpret_cast<uint4*>(sK + tile_offset(kBN, row, 2 * c + 1)) = make_uint4(
          fp8x2_to<T>(xk.z), fp8x2_to<T>(xk.z >> 16), fp8x2_to<T>(xk.w), fp8x2_to<T>(xk.w >> 16));
      *reinterpret_cast<uint4*>(sV + tile_offset(kBN, row, 2 * c)) = make_uint4(
          fp8x2_to<T>(xv.x), fp8x2_to<T>(xv.x >> 16), fp8x2_to<T>(xv.y), fp8x2_to<T>(xv.y >> 16));
      *reinterpret_cast<uint4*>(sV + tile_offset(kBN, row, 2 * c + 1)) = make_uint4(
          fp8x2_to<T>(xv.z), fp8x2_to<T>(xv.z >> 16), fp8x2_to<T>(xv.w), fp8x2_to<T>(xv.w >> 16));
    }
  };
  // BF16/F16: the rows kv_r0 + kRowsPass * p of a thread's chunk kv_c have swizzled places that
  // differ by whole rows (kRowsPass % 8 == 0). A key's row in the cache is its token slot
  // (page * block_size + slot, -1 past kv_end) times the token stride.
  constexpr int kRowsPass = kLoadThreads / DC, kPasses = kBN / kRowsPass;
  static_assert(kRowsPass % 8 == 0 && kBN % kRowsPass == 0, "row passes");
  const int kv_to = tile_offset(kBN, kv_r0, kv_c);
  const int64_t tok_stride = static_cast<int64_t>(a.num_kv_heads) * D;
  auto key_slot = [&](int j) {
    int slot = -1;
    if (j < r.kv_end) {
      if (a.block_shift >= 0)
        slot = pages[j >> a.block_shift] * a.block_size + (j & (a.block_size - 1));
      else
        slot = pages[j / a.block_size] * a.block_size + j % a.block_size;
    }
    return slot;
  };
  auto tile_tokens = [&](int tile, int(&tok)[kPasses]) {
    const int j0 = r.kv_begin + tile * kBN + kv_r0;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) tok[p] = key_slot(j0 + p * kRowsPass);
  };
  auto copy_rows = [&](const T* col, T* stage_tile, const int(&tok)[kPasses]) {
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const bool valid = tok[p] >= 0;
      cp_async16(smem_addr(stage_tile + kv_to + p * kRowsPass * 64),
                 valid ? col + tok[p] * tok_stride : col, valid);
    }
  };
  // cp.async group i: kPipe == 2 K tile i and V tile i - 1 (the tokens of V's rows kept from the
  // previous group's K), else K and V tile i; each into stage tile % kStages, if below n_tiles.
  int tok_prev[kPasses];
  auto load_group = [&](int i) {
    int tok[kPasses];
    if (i < r.n_tiles) {
      tile_tokens(i, tok);
      copy_rows(kcol, sK + (i % kStages) * kBN * D, tok);
      if constexpr (kPipe != 2) copy_rows(vcol, sV + (i % kStages) * kBN * D, tok);
    }
    if constexpr (kPipe == 2) {
      if (i >= 1 && i - 1 < r.n_tiles)
        copy_rows(vcol, sV + ((i - 1) % kStages) * kBN * D, tok_prev);
#pragma unroll
      for (int p = 0; p < kPasses; ++p) tok_prev[p] = tok[p];
    }
    cp_async_commit();
  };

  // kPipe 4-6's mbarriers, after the V stages: Q full, then per stage K full, K empty, V full,
  // V empty, then (kPersist) Q empty. A full barrier's phase completes when each producer
  // thread's copies into the stage have landed; an empty one's when every consumer thread has seen
  // its wgmma reading the stage retire. Use u = g / kStages of stage g % kStages is phase u of
  // both, g counting the K (or V) tiles from the CTA's first work tile on (kPersist: the rings
  // run on across work tiles); Q's use j (the CTA's j-th work tile) is phase j. kPersist: every
  // use of a stage, each work tile's last V tile included, gets its empty arrivals, or the
  // barrier's phases fall behind the uses (parity waits cannot tell: the producer then waits
  // forever, or, two phases behind, refills a stage still being read).
  const uint32_t bar0 = smem_addr(sV + kStages * kBN * D), q_full = bar0;
  auto k_full = [&](int st) { return bar0 + 8 * (1 + st); };
  auto k_empty = [&](int st) { return bar0 + 8 * (1 + kStages + st); };
  auto v_full = [&](int st) { return bar0 + 8 * (1 + 2 * kStages + st); };
  auto v_empty = [&](int st) { return bar0 + 8 * (1 + 3 * kStages + st); };
  const uint32_t q_empty = bar0 + 8 * (1 + 4 * kStages);
  static_assert(8 * (2 + 4 * kWsStages) <= 128, "the mbarriers fit their 128 bytes");
  // kPipe 4-6's producer, per work tile: Q, then K_0, then K_{t+1} and V_t for t = 0, 1, ... (the
  // order the consumers need them), each into its ring's stage g % kStages once the consumers have
  // freed it; kPersist: Q once the consumers' last Q K product of the previous work tile has
  // retired, so the next tile's Q and first K tiles load during that tile's last P V product and
  // output. Lane l of each warp looks up one of the 32 keys its warp's threads copy (the rows
  // kv_r0 + kRowsPass * p of the threads' kv_r0 % kRowLanes == l % kRowLanes, p = l / kRowLanes)
  // and hands the slot to those threads with a shuffle; V_t's slots are K_t's.
  auto produce = [&] {
    constexpr int kRowLanes = 32 / DC;
    static_assert(!kWs || kPasses * kRowLanes == 32, "one key per producer lane");
    const int look_row = warp * kRowLanes + lane % kRowLanes + kRowsPass * (lane / kRowLanes);
    auto copy_tile = [&](const T* col, T* stage_tile, int slot) {
      int tok[kPasses];
#pragma unroll
      for (int p = 0; p < kPasses; ++p)
        tok[p] = __shfl_sync(0xffffffffu, slot, p * kRowLanes + lane / DC);
      copy_rows(col, stage_tile, tok);
    };
    // One work tile: j the CTA's work tiles before it, g0 its K/V tiles before it.
    auto produce_work = [&](int j, int g0) {
      if (kPersist && j >= 1) mbar_wait(q_empty, (j - 1) & 1);
      load_q();
      cp_async_mbar_arrive(q_full);
      int slot_v = -1;
      for (int t = 0; t <= r.n_tiles; ++t) {
        const int slot_k = t < r.n_tiles ? key_slot(r.kv_begin + t * kBN + look_row) : -1;
        if (t < r.n_tiles) {
          const int g = g0 + t, st = g % kStages;
          if (g >= kStages) mbar_wait(k_empty(st), (g / kStages - 1) & 1);
          copy_tile(kcol, sK + st * kBN * D, slot_k);
          cp_async_mbar_arrive(k_full(st));
        }
        if (t >= 1) {
          const int g = g0 + t - 1, st = g % kStages;
          if (g >= kStages) mbar_wait(v_empty(st), (g / kStages - 1) & 1);
          copy_tile(vcol, sV + st * kBN * D, slot_v);
          cp_async_mbar_arrive(v_full(st));
        }
        slot_v = slot_k;
      }
    };
    // kPersist: the two work tiles as straight-line code (a loop carried the first's state
    // across and spilled at 40 registers).
    produce_work(0, 0);
    if constexpr (kPersist) {
      const int g0 = r.n_tiles;
      if (next_work()) produce_work(1, g0);
    }
    cp_async_commit();  // wait for this thread's copies before it exits
    cp_async_wait<0>();
  };

  if constexpr (kWs) {
    if (threadIdx.x == 0) {
      mbar_init(q_full, 128);
      if constexpr (kPersist) mbar_init(q_empty, kThreads);
      for (int st = 0; st < kStages; ++st) {
        mbar_init(k_full(st), 128);
        mbar_init(v_full(st), 128);
        mbar_init(k_empty(st), kThreads);
        mbar_init(v_empty(st), kThreads);
      }
      mbar_fence_init();
    }
    __syncthreads();
    if (producer) {
      setmaxnreg_dec<producer_regs<kPipe>()>();
      produce();
      return;
    }
    setmaxnreg_inc<consumer_regs<kPipe>()>();
  } else {
    if constexpr (kFp8)
      load_kv_fp8(0, 0);
    else
      load_group(0);
    cp_async_commit();  // (an empty group for BF16/F16)
  }

  // This thread's two rows: lane/4 and lane/4 + 8 of its warp's 16 (wgmma accumulator layout).
  const int row0 = warp * 16 + (lane >> 2);
  int qpos[2];
  float o[D / 2];
  float m_run[2], l_run[2];
  // A work tile's start: its rows' query positions, O and the running max and sum cleared.
  auto start_tile = [&] {
    for (int h = 0; h < 2; ++h)
      qpos[h] = a.window < 0 ? r.L - 1  // non-causal
                             : r.L - r.qlen + min((r.m0 + row0 + 8 * h) / r.G, r.qlen - 1);
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
    m_run[0] = m_run[1] = -INFINITY;
    l_run[0] = l_run[1] = 0.0f;
  };
  start_tile();
  const uint32_t sQ_addr = smem_addr(sQ), sK_addr = smem_addr(sK), sV_addr = smem_addr(sV);
  const float qk_scale = kFp8 ? a.scale * a.k_scale : a.scale;
  const float scale_log2 = qk_scale * kLog2e;
  // Every warpgroup runs the loop, also one past the last query row (its Q rows are zeros and its
  // outputs are not stored): no wgmma sits on a divergent path, which would serialize them.
  const float fscale = a.softcap > 0.0f ? 1.0f : scale_log2;
  uint32_t pa[kBN / 16][4];
  float s[NT * 4];
#pragma unroll
  for (int i = 0; i < NT * 4; ++i) s[i] = 0.0f;
  auto wait_tile = [&] {
    cp_async_wait<0>();
    fence_proxy_async();  // this thread's cp.async data, before the tensor cores read it
    __syncthreads();
  };
  // S = Q K_t into s (the first k-step overwrites it).
  auto issue_qk = [&](int t) {
    wgmma_fence();
    const uint32_t k_addr = sK_addr + (t % kStages) * (kBN * D * 2);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t qa = sQ_addr + (kk >> 2) * (kBM * 128) + wg * (64 * 128) + (kk & 3) * 32;
      const uint32_t kb = k_addr + (kk >> 2) * (kBN * 128) + (kk & 3) * 32;
      qk_mma<T, kBN>(s, wgmma_desc(qa, 16, 1024), wgmma_desc(kb, 16, 1024), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
  // O += P V_t; 16 keys = two 8-row groups (1024 B apart), the D/64 column blocks kBN * 128 B
  // apart.
  auto issue_pv = [&](int t) {
    const uint32_t v_addr = sV_addr + (t % kStages) * (kBN * D * 2);
#pragma unroll
    for (int kc2 = 0; kc2 < kBN / 16; ++kc2)
      pv_mma<T, D>(o, pa[kc2], wgmma_desc(v_addr + kc2 * 16 * 128, kBN * 128, 1024));
    wgmma_commit();
  };
  // Tile t's mask and online softmax, in log2 units: p = 2^(s * fscale - m), m the running
  // maximum of s * fscale. Leaves P in s and O's rescale factors in alpha. Maxima and sums run in
  // four independent chains.
  auto softmax = [&](int t, float(&alpha)[2]) {
    const int n0 = r.kv_begin + t * kBN;
    if (a.softcap > 0.0f) {
#pragma unroll
      for (int i = 0; i < NT * 4; ++i)
        s[i] = a.softcap * tanhf(s[i] * qk_scale / a.softcap) * kLog2e;
    }
    if (n0 + kBN - 1 > r.qpos_lo || (a.window > 0 && n0 <= r.qpos_hi - a.window)) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = n0 + nt * 8 + 2 * (lane & 3) + (e & 1);
          const int qp = qpos[e >> 1];
          if (key > qp || (a.window > 0 && key <= qp - a.window)) s[nt * 4 + e] = -INFINITY;
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m4[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        m4[nt & 3] = fmaxf(m4[nt & 3], fmaxf(s[nt * 4 + 2 * h], s[nt * 4 + 2 * h + 1]));
      float mx = fmaxf(fmaxf(m4[0], m4[1]), fmaxf(m4[2], m4[3]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(m_run[h], mx * fscale);
      const float m_use = mx == -INFINITY ? 0.0f : mx;
      alpha[h] = fast_exp2(m_run[h] - m_use);
      m_run[h] = mx;
      float r4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float p0 = fast_exp2(fmaf(s[nt * 4 + 2 * h], fscale, -m_use));
        const float p1 = fast_exp2(fmaf(s[nt * 4 + 2 * h + 1], fscale, -m_use));
        s[nt * 4 + 2 * h] = p0;
        s[nt * 4 + 2 * h + 1] = p1;
        r4[nt & 3] += p0 + p1;
      }
      l_run[h] = l_run[h] * alpha[h] + ((r4[0] + r4[1]) + (r4[2] + r4[3]));
    }
  };
  auto rescale_pack = [&](const float(&alpha)[2]) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      o[dt * 4 + 0] *= alpha[0];
      o[dt * 4 + 1] *= alpha[0];
      o[dt * 4 + 2] *= alpha[1];
      o[dt * 4 + 3] *= alpha[1];
    }
#pragma unroll
    for (int kc2 = 0; kc2 < kBN / 16; ++kc2) {
      pa[kc2][0] = pack2<T>(s[(2 * kc2) * 4 + 0], s[(2 * kc2) * 4 + 1]);
      pa[kc2][1] = pack2<T>(s[(2 * kc2) * 4 + 2], s[(2 * kc2) * 4 + 3]);
      pa[kc2][2] = pack2<T>(s[(2 * kc2 + 1) * 4 + 0], s[(2 * kc2 + 1) * 4 + 1]);
      pa[kc2][3] = pack2<T>(s[(2 * kc2 + 1) * 4 + 2], s[(2 * kc2 + 1) * 4 + 3]);
    }
  };
  float alpha[2];
  // kPipe 4-6: wait for a stage's full barrier (and make the cp.async data visible to the tensor
  // cores).
  auto wait_full = [&](uint32_t bar, int parity) {
    mbar_wait(bar, parity);
    fence_proxy_async();  // the producer's cp.async writes, before the tensor cores read them
  };
  // kPipe 5/6: warpgroup w issues its GEMMs once the other has issued its own (named barrier
  // 1 + w, 256 threads: w syncs, the other arrives); warpgroup 0 goes first. Each issues
  // n_tiles + 1 times per work tile; warpgroup 1's last arrival is left out (kPipe 6: taken by
  // warpgroup 0 after the last work tile), so every arrival is consumed.
  auto gemms_begin = [&] {
    if constexpr (kPingPong) named_bar_sync(1 + wg, 2 * 128);
  };
  auto gemms_end = [&](bool last) {
    if constexpr (kPingPong)
      if (kPersist || !last || wg == 0) named_bar_arrive(2 - wg, 2 * 128);
  };
  if constexpr (kPingPong)
    if (wg == 1) named_bar_arrive(1, 2 * 128);
  // kPersist: work tiles done (Q's use) and K/V tiles done (the rings' position) by this CTA.
  int j = 0, g0 = 0;
  for (;;) {
    if constexpr (kFp8) {
      // One barrier publishes raw tile t (and frees raw stage (t+1) % 2 and the canonical tiles,
      // whose last readers were tile t - 1's); the second publishes the converted tile.
      for (int t = 0; t < r.n_tiles; ++t) {
        cp_async_wait<0>();
        __syncthreads();
        if (t + 1 < r.n_tiles) load_kv_fp8(t + 1, (t + 1) & 1);
        cp_async_commit();
        convert_kv(t & 1);
        fence_proxy_async();  // this thread's converted tiles, before the tensor cores read them
        __syncthreads();
        issue_qk(0);
        wgmma_wait<0>();
        softmax(t, alpha);
        rescale_pack(alpha);
        wgmma_fence();
        issue_pv(0);
        wgmma_wait<0>();
      }
    } else if constexpr (kPipe == 0) {
      // Serial loop: one barrier per tile publishes cp.async group t (K_t, V_t) and, since every
      // thread has passed it, all are done with tile t - 1, whose stage group t + 1 then refills.
      for (int t = 0; t < r.n_tiles; ++t) {
        wait_tile();
        issue_qk(t);
        load_group(t + 1);  // while the tensor cores work
        wgmma_wait<0>();
        softmax(t, alpha);
        rescale_pack(alpha);
        wgmma_fence();
        issue_pv(t);
        wgmma_wait<0>();
      }
    } else if constexpr (kWs) {
      // kPipe 2's loop (below) with the producer's stages: wait for a stage's full barrier, arrive
      // on its empty barrier once the wgmma reading it has retired. Q K_t is issued before V_{t-1}
      // is waited for. Tile t of the work tile is the CTA's K/V tile g = g0 + t.
      wait_full(q_full, j & 1);
      wait_full(k_full(g0 % kStages), (g0 / kStages) & 1);
      gemms_begin();
      issue_qk(g0);
      gemms_end(false);
      wgmma_wait<0>();
      mbar_arrive(k_empty(g0 % kStages));
      softmax(0, alpha);  // O is still zero
      rescale_pack(alpha);
      for (int t = 1; t < r.n_tiles; ++t) {
        const int g = g0 + t, sk = g % kStages, sv = (g - 1) % kStages;
        wait_full(k_full(sk), (g / kStages) & 1);
        gemms_begin();
        issue_qk(g);
        wait_full(v_full(sv), ((g - 1) / kStages) & 1);
        wgmma_fence();  // (ptxas would insert it: the wait loop sits between the two GEMMs)
        issue_pv(g - 1);
        gemms_end(false);
        wgmma_wait<1>();  // S_t: K_t is free
        mbar_arrive(k_empty(sk));
        softmax(t, alpha);
        wgmma_wait<0>();  // P_{t-1} V_{t-1}: O, P and V_{t-1} are free
        mbar_arrive(v_empty(sv));
        rescale_pack(alpha);
      }
      if constexpr (kPersist) mbar_arrive(q_empty);  // the work tile's last Q K product retired
      const int last = g0 + r.n_tiles - 1;
      wait_full(v_full(last % kStages), (last / kStages) & 1);
      gemms_begin();
      wgmma_fence();
      issue_pv(last);
      gemms_end(true);
      wgmma_wait<0>();
      // kPersist: the V ring runs on into the next work tile, whose V_1 (the CTA's V tile
      // last + 2) waits for this use of the stage; without this arrival the stage's empty
      // barrier falls a phase behind its uses and the producer waits on it forever (kPipe 4/5
      // end here: no tile follows).
      if constexpr (kPersist) mbar_arrive(v_empty(last % kStages));
    } else {
      // FlashAttention-3's intra-warpgroup overlap: iteration t issues S = Q K_t and then
      // O += P_{t-1} V_{t-1}, waits for S only, and runs tile t's softmax while the P V product is
      // still on the tensor cores; O is rescaled once that product is done. One barrier per tile:
      // it publishes cp.async group t (kPipe 2: K_t, V_{t-1}; 3: K_t, V_t) and, since every thread
      // has passed it, all are done with iteration t - 1, i.e. with K_{t-1} and V_{t-2}, whose
      // stages group t + 1 (kPipe 2: K_{t+1}, V_t; 3: K_{t+1}, V_{t+1} in the third stage) then
      // refills, issued behind the GEMMs.
      wait_tile();
      issue_qk(0);
      load_group(1);
      wgmma_wait<0>();
      softmax(0, alpha);  // O is still zero
      rescale_pack(alpha);
      for (int t = 1; t < r.n_tiles; ++t) {
        wait_tile();
        issue_qk(t);
        issue_pv(t - 1);
        load_group(t + 1);
        wgmma_wait<1>();  // S_t
        softmax(t, alpha);
        wgmma_wait<0>();  // P_{t-1} V_{t-1}: O and P are free again
        rescale_pack(alpha);
      }
      wait_tile();  // kPipe 2: V_{n-1} is group n
      wgmma_fence();
      issue_pv(r.n_tiles - 1);
      wgmma_wait<0>();
    }
    cp_async_wait<0>();

#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int pr = r.m0 + row0 + 8 * h;
      if (pr >= r.rows) continue;
      const int64_t token = r.q0 + pr / r.G;
      const int head = r.kh * r.G + pr % r.G;
      float oscale = 1.0f;
      if (a.sinks) {
        const float sink = a.sinks[head] * kLog2e;
        const float mf = fmaxf(m_run[h], sink);
        oscale = fast_exp2(m_run[h] - mf);
        l = l * oscale + fast_exp2(sink - mf);
      }
      float inv = oscale / l;
      if constexpr (kFp8) inv *= a.v_scale;
      T* dst = static_cast<T*>(a.out) + token * a.out_stride + static_cast<int64_t>(head) * D;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const int col = dt * 8 + 2 * (lane & 3);
        *reinterpret_cast<uint32_t*>(dst + col) =
            pack2<T>(o[dt * 4 + 2 * h] * inv, o[dt * 4 + 2 * h + 1] * inv);
      }
    }
    if constexpr (!kPersist) {
      break;
    } else {
      ++j;
      g0 += r.n_tiles;
      if (!next_work()) break;
      start_tile();
    }
  }  // work tiles
  if constexpr (kPersist && kPingPong)
    if (wg == 0) named_bar_sync(1, 2 * 128);  // warpgroup 1's last arrival
}

template <typename T, int D, int NWG, int BN, bool kFp8, int kPipe>
void launch_typed(const AttnLaunch& a, cudaStream_t s) {
  constexpr size_t smem = wgmma_smem_bytes<D, NWG, BN, kFp8, kPipe>();
  static std::atomic<uint64_t> configured{0};
  max_dynamic_smem_once(configured, wgmma_attention_kernel<T, D, NWG, BN, kFp8, kPipe>,
                        static_cast<int>(smem));
  const int G = a.num_heads / a.num_kv_heads;
  const int64_t max_rows = static_cast<int64_t>(a.max_query_len) * G;
  const int64_t m_tiles = (max_rows + 64 * NWG - 1) / (64 * NWG);
  dim3 grid(static_cast<unsigned>(m_tiles), static_cast<unsigned>(a.num_seqs * a.num_kv_heads), 1u);
  if constexpr (kPipe == 6) grid.x = static_cast<unsigned>((m_tiles + 1) / 2);  // tile pairs
  // kPipe 0-5, at most four waves of CTAs (one CTA per SM): longest first over all (sequence, kv
  // head)s (kPipe 6's pairs are balanced by construction and keep blockIdx order).
  // On the H200 at 1 x 2,048 causal tokens, 32/8 heads, d128: 345-349 against 310-320 TFLOP/s
  // (docs/performance.md). Longer grids keep each (sequence, kv head) together: ordered across,
  // 1 x 8,192 tokens fell from 490-505 to 467.
  AttnLaunch b = a;
  b.longest_first_across = a.wgmma_order_across >= 0
                               ? a.wgmma_order_across == 1
                               : static_cast<int64_t>(grid.x) * grid.y <= 4 * sm_count();
  launch(wgmma_attention_kernel<T, D, NWG, BN, kFp8, kPipe>, grid,
         128 * NWG + (kPipe >= 4 ? 128 : 0), smem, s, b);
}

// The K/V pipeline of the BF16/F16 kernel (a.wgmma_pipeline, CudaTuning): 0 the serial loop (each
// GEMM waited before the softmax that follows), 2 or 3 the overlapped loop with that many K/V
// stages, 4 the warp-specialized one, 5 that with ping-pong, 6 that with two work tiles per CTA
// (one warpgroup: 2 for 3 to 6). Default 6: on the H200 at 1 x 4,096 causal tokens, 32/8 heads,
// d128, 450.2-450.6 TFLOP/s against 426.5-442.9 (5) in the same run; 5 against 4 and 2: 433.9,
// 426.8, 342.1.

// The CTA shape: a.wgmma_warpgroups (CudaTuning). FP8 caches: two warpgroups always
// (one instantiation fewer per type; the one-warpgroup shape measured slower with BF16).
template <typename T, int D>
void launch_shape(const AttnLaunch& a, cudaStream_t s) {
  if (a.kv_fp8)
    launch_typed<T, D, 2, 128, true, 0>(a, s);
  else if (a.wgmma_warpgroups == 1)
    a.wgmma_pipeline == 0 ? launch_typed<T, D, 1, 64, false, 0>(a, s)
                          : launch_typed<T, D, 1, 64, false, 2>(a, s);
  else if (a.wgmma_pipeline == 0)
    launch_typed<T, D, 2, 128, false, 0>(a, s);
  else if (a.wgmma_pipeline == 3)
    launch_typed<T, D, 2, 128, false, 3>(a, s);
  else if (a.wgmma_pipeline == 4)
    launch_typed<T, D, 2, 128, false, 4>(a, s);
  else if (a.wgmma_pipeline == 5)
    launch_typed<T, D, 2, 128, false, 5>(a, s);
  else if (a.wgmma_pipeline == 6)
    launch_typed<T, D, 2, 128, false, 6>(a, s);
  else
    launch_typed<T, D, 2, 128, false, 2>(a, s);
}

}  // namespace

bool wgmma_attention_supported(const AttnLaunch& a) {
  auto ok16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return (a.type == Elem::kBF16 || a.type == Elem::kF16) &&
         (a.head_dim == 64 || a.head_dim == 128) && a.q_stride % 8 == 0 && a.out_stride % 2 == 0 &&
         ok16(a.q) && ok16(a.k_cache) && ok16(a.v_cache) &&
         (reinterpret_cast<uintptr_t>(a.out) & 3) == 0;
}

void launch_wgmma_attention(const AttnLaunch& a, cudaStream_t s) {
  if (a.num_tokens == 0 || a.num_seqs == 0) return;
  if (a.type == Elem::kBF16) {
    a.head_dim == 128 ? launch_shape<__nv_bfloat16, 128>(a, s)
                      : launch_shape<__nv_bfloat16, 64>(a, s);
  } else {
    a.head_dim == 128 ? launch_shape<__half, 128>(a, s) : launch_shape<__half, 64>(a, s);
  }
}

}  // namespace atom::kernels::cuda
