// Paged flash attention over an FP8 (e4m3) KV cache on tensor cores. The structure is
// attention.cu's flash kernel (GQA-packed rows, K/V tiles gathered with cp.async, online softmax
// in base 2; decode mode: the four warps share 16 rows and split each tile's keys, long contexts
// split across CTAs), but K and V stay e4m3 bytes in shared memory - half the bytes read from
// memory - and are converted to FP16 in registers as the MMAs need them (mma.sync m16n8k16, FP16
// operands, FP32 accumulation; e4m3 -> FP16 is exact, one instruction per pair).
//
// Fragments straight from e4m3 rows, without ldmatrix:
// - S = Q Kᵀ: a thread's B fragment of one 16-wide k step holds, for one key, head dims
//   {2c, 2c+1, 2c+8, 2c+9} (c = lane % 4). A dot product may visit the head dims in any order as
//   long as Q and K agree, so k step s is fed dims 64 (s/4) + 16 c + 4 (s%4) + {0, 1, 2, 3}: one
//   16-byte load of a key's dims [64 j + 16 c, +16) holds the thread's K for the four k steps of
//   block j, and Q is written to shared memory in the matching order (once per CTA).
// - O += P V: the keys of a 16-key group may be visited in any order too. S column n of the
//   group's two 8-key tiles reads key 4 (n/2) + 2 (tile % 2) + n % 2, so the four keys whose P a
//   thread holds (columns 2c, 2c+1 of both tiles) are keys 4c .. 4c+3; and output column n of
//   8-wide tile dt is head dim n (D/8) + dt, so a thread's V values for all D/8 tiles are one
//   contiguous run of D/8 bytes of each of its four keys' rows.
// The scales fold into the arithmetic: q is multiplied by scale * k_scale (before its rounding to
// FP16) and the output by v_scale.
#include <atomic>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/mma.cuh"

namespace atom::kernels::cuda {

namespace {

constexpr int kWarps = 4;

template <int D, bool kDecode>
struct Fp8Config {
  static constexpr int BM = kDecode ? 16 : kWarps * 16;  // rows per CTA (one atom per warp)
  static constexpr int BN = 64;                          // keys per tile
  static constexpr int kStages = kDecode ? 3 : 2;
  static constexpr int kWarpKeys = kDecode ? 16 : BN;  // keys of a tile one warp handles
  static constexpr size_t kQBytes = static_cast<size_t>(BM) * D * 2;  // FP16
  static constexpr size_t kSmem = kQBytes + static_cast<size_t>(2 * kStages * BN * D);
  // Decode merges the warps' states through the K/V stages.
  static_assert(!kDecode || 2 * kStages * BN * D >= (kWarps * 16 * D + 2 * kWarps * 16) * 4,
                "merge scratch");
};

// Row r's 16-byte chunk c of an e4m3 tile is stored at chunk c ^ kv_swizzle<D>(r), which keeps the
// fragment loads below free of bank conflicts (for D = 64 the V loads keep a 2-way conflict: a
// 64-byte row puts the same columns of a thread's four keys on the same banks). Only row bits 0,
// 2 and 3 enter, so every 8-key tile of a thread shares its K swizzle.
template <int D>
__device__ __forceinline__ int kv_swizzle(int r) {
  if constexpr (D == 64)
    return (r >> 2) & 3;
  else if constexpr (D == 128)
    return (((r >> 2) & 3) << 1) ^ ((r & 1) << 2);
  else
    return ((r & 1) << 2) ^ ((r >> 2) & 1) ^ (((r >> 3) & 1) << 2);
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Two adjacent output elements (i even) of type t.
__device__ __forceinline__ void store_pair(void* out, Elem t, int64_t i, float v0, float v1) {
  if (t == Elem::kBF16)
    *reinterpret_cast<uint32_t*>(static_cast<__nv_bfloat16*>(out) + i) =
        pack2<__nv_bfloat16>(v0, v1);
  else
    *reinterpret_cast<uint32_t*>(static_cast<__half*>(out) + i) = pack2<__half>(v0, v1);
}

template <int D, bool kDecode>
__global__ void __launch_bounds__(kWarps * 32) flash_fp8_kernel(AttnLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  using C = Fp8Config<D, kDecode>;
  constexpr int BM = C::BM, BN = C::BN, S = C::kStages;
  constexpr int DC = D / 16;            // 16-byte chunks of an e4m3 row
  constexpr int NT = C::kWarpKeys / 8;  // 8-key MMA tiles per warp per tile
  constexpr int DT = D / 8;             // 8-column output tiles (and V bytes per thread and key)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __half* sQ = reinterpret_cast<__half*>(smem_raw);  // [BM][D], chunk ^ (row % 8) swizzle
  uint8_t* sK = smem_raw + C::kQBytes;               // [S][BN][D] e4m3, kv_swizzle
  uint8_t* sV = sK + S * BN * D;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const CtaRange r =
      cta_range(a, kDecode ? 0 : gridDim.x - 1 - blockIdx.x, BM, BN);  // long tiles first
  if (r.m0 >= r.rows) return;
  const int split = blockIdx.z;
  int splits = 1, t_begin = 0, t_end = r.n_tiles;
  if constexpr (kDecode) {
    splits = decode_splits(r.n_tiles, a.num_splits, a.split_min_tiles);
    if (split >= splits) return;
    const int per = (r.n_tiles + splits - 1) / splits;
    t_begin = split * per;
    t_end = min(r.n_tiles, t_begin + per);
  }

  const int row_base = kDecode ? 0 : warp * 16;
  auto out_row_of = [&](int pr) -> int64_t {  // token * num_heads + head, or -1 for padding
    return pr < r.rows ? static_cast<int64_t>(r.q0 + pr / r.G) * a.num_heads + r.kh * r.G + pr % r.G
                       : -1;
  };
  int qpos[2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
    qpos[h] = a.window < 0 ? r.L - 1  // non-causal
                           : r.L - r.qlen + min((r.m0 + row_base + g + 8 * h) / r.G, r.qlen - 1);

  // Q in the k-step order above, times scale * k_scale, in FP16. Chunk k8 of a row holds logical
  // columns 8 k8 .. 8 k8 + 7, i.e. k step s = k8 / 2, fragment columns 8 (k8 % 2) + i, whose dims
  // are 64 (s/4) + 4 (s%4) + 2 (k8 % 2) + 16 (i/2) + i % 2.
  const float qscale = a.scale * a.k_scale;
  for (int idx = tid; idx < BM * (D / 8); idx += kWarps * 32) {
    const int row = idx / (D / 8), k8 = idx % (D / 8);
    const int pr = r.m0 + row;
    uint32_t w[4] = {0u, 0u, 0u, 0u};
    if (pr < r.rows) {
      const int i = pr / r.G, gi = pr % r.G;
      const int s = k8 >> 1;
      const int64_t base = static_cast<int64_t>(r.q0 + i) * a.q_stride +
                           static_cast<int64_t>(r.kh * r.G + gi) * D + 64 * (s >> 2) + 4 * (s & 3) +
                           2 * (k8 & 1);
#pragma unroll
      for (int cc = 0; cc < 4; ++cc)
        w[cc] = pack2<__half>(load_elem(a.q, a.type, base + 16 * cc) * qscale,
                              load_elem(a.q, a.type, base + 16 * cc + 1) * qscale);
    }
    *reinterpret_cast<uint4*>(sQ + row * D + ((k8 ^ (row & 7)) << 3)) =
        make_uint4(w[0], w[1], w[2], w[3]);
  }

  const int32_t* pages = a.page_indices + a.page_indptr[r.s];
  const uint8_t* kc = static_cast<const uint8_t*>(a.k_cache);
  const uint8_t* vc = static_cast<const uint8_t*>(a.v_cache);
  // Decode looks a tile's pages up in groups before issuing its copies (copy_tile_batched).
  constexpr int kLoadIters = BN * DC / (kWarps * 32);
  auto load_kv = [&](int tile, int stage) {
    const int n0 = r.kv_begin + tile * BN;
    uint8_t* dk = sK + stage * BN * D;
    uint8_t* dv = sV + stage * BN * D;
    if constexpr (kDecode && BN * DC % (kWarps * 32) == 0) {
      copy_tile_batched<kLoadIters, (kLoadIters < 8 ? kLoadIters : 8)>(
          [&](int i) { return tile_chunk_slot<DC>(a, pages, n0, r.kv_end, tid + i * kWarps * 32); },
          [&](int i, int slot) {
            const int idx = tid + i * kWarps * 32, row = idx / DC, ch = idx % DC;
            const bool valid = slot >= 0;
            const int64_t off =
                valid ? (static_cast<int64_t>(slot) * a.num_kv_heads + r.kh) * D + ch * 16 : 0;
            const int to = row * D + ((ch ^ kv_swizzle<D>(row)) << 4);
            cp_async16(smem_addr(dk + to), kc + off, valid);
            cp_async16(smem_addr(dv + to), vc + off, valid);
          });
    } else {
      for (int idx = tid; idx < BN * DC; idx += kWarps * 32) {
        const int row = idx / DC, ch = idx % DC;
        const int j = n0 + row;
        const bool valid = j < r.kv_end;
        const int64_t off = valid ? kv_row_offset(a, pages, j, r.kh) + ch * 16 : 0;
        const int to = row * D + ((ch ^ kv_swizzle<D>(row)) << 4);
        cp_async16(smem_addr(dk + to), kc + off, valid);
        cp_async16(smem_addr(dv + to), vc + off, valid);
      }
    }
  };
#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    if (t_begin + i < t_end) load_kv(t_begin + i, i);
    cp_async_commit();
  }

  float o[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const bool warp_active = kDecode || r.m0 + warp * 16 < r.rows;
  const int key_base = kDecode ? warp * 16 : 0;  // this warp's keys within a tile
  // K: this thread's key row of 8-key tile nt is k_row0 + 16 (nt/2) + 2 (nt%2).
  const int k_row0 = key_base + 4 * (g >> 1) + (g & 1);
  const int k_sw = kv_swizzle<D>(k_row0);
  // V: this thread's rows of 16-key group h are v_row0 + 16 h + t (t < 4); its D/8 bytes start at
  // byte g D/8 of the row (v_off: stage-relative byte offsets, group 0).
  constexpr int VU = D >= 128 ? D / 128 : 1;  // 16-byte (D = 64: 8-byte) loads per row
  int v_off[4][VU];
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const int row = key_base + 4 * c + t;
    const int sw = kv_swizzle<D>(row);
#pragma unroll
    for (int u = 0; u < VU; ++u) {
      if constexpr (D == 64)
        v_off[t][u] = row * D + (((g >> 1) ^ sw) << 4) + ((g & 1) << 3);
      else
        v_off[t][u] = row * D + (((g * VU + u) ^ sw) << 4);
    }
  }
  const uint32_t sQ_addr = smem_addr(sQ);
  const uint32_t q_off = (row_base + (lane & 15)) * D * 2 + (((lane >> 4) ^ (lane & 7)) << 4);

  for (int t = t_begin; t < t_end; ++t) {
    const int stage = (t - t_begin) % S;
    const int ahead = t + S - 1;
    if (ahead < t_end) load_kv(ahead, (ahead - t_begin) % S);
    cp_async_commit();
    cp_async_wait<S - 1>();
    __syncthreads();
    if (warp_active) {
      const int n0 = r.kv_begin + t * BN + key_base;
      const uint8_t* ks = sK + stage * BN * D;
      const uint8_t* vs = sV + stage * BN * D;
      float sc[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[nt][e] = 0.0f;
          // S = Q Kᵀ, 64 head dims (four k steps) at a time.
#pragma unroll
      for (int j = 0; j < D / 64; ++j) {
        uint32_t qa[4][4];
#pragma unroll
        for (int kq = 0; kq < 4; ++kq) ldmatrix_x4(sQ_addr + (q_off ^ ((4 * j + kq) << 5)), qa[kq]);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint4 kr = *reinterpret_cast<const uint4*>(
              ks + (k_row0 + 16 * (nt >> 1) + 2 * (nt & 1)) * D + (((4 * j + c) ^ k_sw) << 4));
#pragma unroll
          for (int kq = 0; kq < 4; ++kq) {
            const uint32_t w = word_of(kr, kq);
            mma16816<__half>(sc[nt], qa[kq], fp8x2_to_f16x2(w), fp8x2_to_f16x2(w >> 16));
          }
        }
      }
      // Log2 units (the soft-cap first when set), then the causal / window mask. Column
      // 2c + (e & 1) of tile nt is key 16 (nt/2) + 4c + 2 (nt%2) + (e & 1) of the warp's keys.
      if (a.softcap > 0.0f) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sc[nt][e] = a.softcap * tanhf(sc[nt][e] / a.softcap) * kLog2e;
      } else {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sc[nt][e] *= kLog2e;
      }
      if (n0 + C::kWarpKeys - 1 > r.qpos_lo || (a.window > 0 && n0 <= r.qpos_hi - a.window)) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = n0 + 16 * (nt >> 1) + 4 * c + 2 * (nt & 1) + (e & 1);
            const int qp = qpos[e >> 1];
            if (key > qp || (a.window > 0 && key <= qp - a.window)) sc[nt][e] = -INFINITY;
          }
      }
      // Online softmax (as attention.cu).
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = m_run[h];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(sc[nt][2 * h], sc[nt][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_use = mx == -INFINITY ? 0.0f : mx;
        const float alpha = fast_exp2(m_run[h] - m_use);
        m_run[h] = mx;
        float rs = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float p0 = fast_exp2(sc[nt][2 * h] - m_use);
          const float p1 = fast_exp2(sc[nt][2 * h + 1] - m_use);
          sc[nt][2 * h] = p0;
          sc[nt][2 * h + 1] = p1;
          rs += p0 + p1;
        }
        l_run[h] = l_run[h] * alpha + rs;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          o[dt][2 * h] *= alpha;
          o[dt][2 * h + 1] *= alpha;
        }
      }
      // O += P V, one 16-key group at a time: byte dt of a key's run is tile dt's column g.
#pragma unroll
      for (int h = 0; h < NT / 2; ++h) {
        const uint32_t pa[4] = {pack2<__half>(sc[2 * h][0], sc[2 * h][1]),
                                pack2<__half>(sc[2 * h][2], sc[2 * h][3]),
                                pack2<__half>(sc[2 * h + 1][0], sc[2 * h + 1][1]),
                                pack2<__half>(sc[2 * h + 1][2], sc[2 * h + 1][3])};
        uint32_t vw[4][DT / 4];  // [key 4c + t][word]
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const uint8_t* base = vs + 16 * h * D;
          if constexpr (D == 64) {
            const uint2 x = *reinterpret_cast<const uint2*>(base + v_off[t][0]);
            vw[t][0] = x.x;
            vw[t][1] = x.y;
          } else {
#pragma unroll
            for (int u = 0; u < VU; ++u) {
              const uint4 x = *reinterpret_cast<const uint4*>(base + v_off[t][u]);
              vw[t][4 * u] = x.x;
              vw[t][4 * u + 1] = x.y;
              vw[t][4 * u + 2] = x.z;
              vw[t][4 * u + 3] = x.w;
            }
          }
        }
#pragma unroll
        for (int w = 0; w < DT / 4; ++w) {
          // Byte pairs (key 4c, 4c+1) and (4c+2, 4c+3) of columns 4w .. 4w+3.
          const uint32_t lo01 = __byte_perm(vw[0][w], vw[1][w], 0x5140);
          const uint32_t hi01 = __byte_perm(vw[0][w], vw[1][w], 0x7362);
          const uint32_t lo23 = __byte_perm(vw[2][w], vw[3][w], 0x5140);
          const uint32_t hi23 = __byte_perm(vw[2][w], vw[3][w], 0x7362);
          mma16816<__half>(o[4 * w], pa, fp8x2_to_f16x2(lo01), fp8x2_to_f16x2(lo23));
          mma16816<__half>(o[4 * w + 1], pa, fp8x2_to_f16x2(lo01 >> 16),
                           fp8x2_to_f16x2(lo23 >> 16));
          mma16816<__half>(o[4 * w + 2], pa, fp8x2_to_f16x2(hi01), fp8x2_to_f16x2(hi23));
          mma16816<__half>(o[4 * w + 3], pa, fp8x2_to_f16x2(hi01 >> 16),
                           fp8x2_to_f16x2(hi23 >> 16));
        }
      }
    }
    __syncthreads();  // the stage just read is a later prefetch's target
  }
  cp_async_wait<0>();

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }

  // Writes row `orow`'s columns col, col + 1 (v0, v1 already times v_scale): the normalised
  // output (sinks applied) or, with several splits, the unnormalised partial with its running
  // max and sum (merged by the last CTA or by attention.cu's combine kernel).
  auto write_row = [&](int64_t orow, float m, float l, int col, float v0, float v1, bool write_ml) {
    write_attention_row<D>(
        a, split, splits, orow, m, l, col, v0, v1, write_ml,
        [&](int64_t r, int head, int c, float x0, float x1) {
          store_pair(a.out, a.type,
                     (r / a.num_heads) * a.out_stride + static_cast<int64_t>(head) * D + c, x0, x1);
        });
  };

  if constexpr (!kDecode) {
    // Output column (2c + u) D/8 + dt of this thread's rows is o[dt][2h + u].
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t orow = out_row_of(r.m0 + row_base + g + 8 * h);
      if (orow < 0) continue;
      const int head = static_cast<int>(orow % a.num_heads);
      float l = l_run[h], oscale = 1.0f;
      if (a.sinks) {
        const float sink = a.sinks[head] * kLog2e;
        const float mf = fmaxf(m_run[h], sink);
        oscale = fast_exp2(m_run[h] - mf);
        l = l * oscale + fast_exp2(sink - mf);
      }
      const float inv = oscale / l * a.v_scale;
      const int64_t base = (orow / a.num_heads) * a.out_stride + static_cast<int64_t>(head) * D;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int u = 0; u < 2; ++u)
          store_elem(a.out, a.type, base + (2 * c + u) * DT + dt, o[dt][2 * h + u] * inv);
    }
  } else {
    // Merge the four warps' states of the same 16 rows through shared memory (the K/V stages,
    // free now), in the fragment order: position dt * 8 + n holds output column n D/8 + dt, so
    // column col + 1 sits 8 positions after col (DT is even).
    merge_decode_warps<D, kWarps>(
        reinterpret_cast<float*>(sK), tid, [&](int dt, int e) { return o[dt][e]; },
        [&](int h) { return m_run[h]; }, [&](int h) { return l_run[h]; },
        [&](int row) { return out_row_of(r.m0 + row); },
        [](int col) { return (col % DT) * 8 + col / DT; }, 8,
        [&](int64_t orow, float m, float l, int col, float v0, float v1) {
          write_row(orow, m, l, col, v0 * a.v_scale, v1 * a.v_scale, col == 0);
        });
    if (splits > 1 && a.counters != nullptr)
      merge_splits_if_last<D, kWarps * 32>(
          a, splits, r.m0, tid, out_row_of, [&](int64_t orow, int head, int col, float v) {
            store_elem(a.out, a.type,
                       (orow / a.num_heads) * a.out_stride + static_cast<int64_t>(head) * D + col,
                       v);
          });
  }
}

template <int D, bool kDecode>
void launch_fp8_typed(const AttnLaunch& a, cudaStream_t s) {
  using C = Fp8Config<D, kDecode>;
  // Per device: each tensor-parallel rank's GPU needs the attribute set once.
  static std::atomic<uint64_t> configured{0};
  max_dynamic_smem_once(configured, flash_fp8_kernel<D, kDecode>, static_cast<int>(C::kSmem));
  const int G = a.num_heads / a.num_kv_heads;
  const int64_t max_rows = static_cast<int64_t>(a.max_query_len) * G;
  const dim3 grid(kDecode ? 1u : static_cast<unsigned>((max_rows + C::BM - 1) / C::BM),
                  static_cast<unsigned>(a.num_seqs * a.num_kv_heads),
                  kDecode ? static_cast<unsigned>(a.num_splits) : 1u);
  launch(flash_fp8_kernel<D, kDecode>, grid, kWarps * 32, C::kSmem, s, a);
}

template <bool kDecode>
void launch_fp8_head_dim(const AttnLaunch& a, cudaStream_t s) {
  if (a.num_tokens == 0 || a.num_seqs == 0) return;
  switch (a.head_dim) {
    case 64:
      launch_fp8_typed<64, kDecode>(a, s);
      break;
    case 128:
      launch_fp8_typed<128, kDecode>(a, s);
      break;
    default:
      launch_fp8_typed<256, kDecode>(a, s);
      break;
  }
}

}  // namespace

void launch_flash_fp8_attention(const AttnLaunch& a, cudaStream_t s) {
  launch_fp8_head_dim<false>(a, s);
}

void launch_flash_fp8_decode(const AttnLaunch& a, cudaStream_t s) {
  launch_fp8_head_dim<true>(a, s);
}

}  // namespace atom::kernels::cuda
