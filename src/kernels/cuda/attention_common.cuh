// Pieces shared by the attention kernels: where a CTA's rows and keys lie, paged K/V addressing,
// the decode split rule (the flash kernel and the combine kernel must agree on it).
#pragma once

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/mma.cuh"

namespace atom::kernels::cuda {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr int kDecodeBlockN = 64;  // keys per tile in decode mode
// Splits a sequence of n_tiles key tiles actually uses out of the launch's num_splits: each
// covers at least min_tiles tiles (CudaTuning::attention_split_min_tiles, default 4: 256 keys),
// since merging the splits' partials costs a threadfence, a ticket and a pass over them.
__device__ __forceinline__ int decode_splits(int n_tiles, int num_splits, int min_tiles) {
  const int by_len = (n_tiles + min_tiles - 1) / min_tiles;
  return max(1, min(num_splits, by_len));
}

// The rows [m0, m0 + bm) of sequence s's packed (token * G + head_in_group) rows for kv head kh,
// and the key tiles of width bn they attend to.
struct CtaRange {
  int s, kh, G, q0, qlen, L, rows, m0;
  int qpos_lo, qpos_hi;  // query positions of the first and last token of the CTA's rows
  int kv_begin, kv_end, n_tiles;
};

// Row tile `mtile` of (sequence, kv head) seq_head = s * num_kv_heads + kh. A negative window is
// non-causal attention: every row's query position is L - 1.
__device__ __forceinline__ CtaRange cta_range(const AttnLaunch& a, int mtile, int seq_head, int bm,
                                              int bn) {
  CtaRange r;
  r.G = a.num_heads / a.num_kv_heads;
  r.s = seq_head / a.num_kv_heads;
  r.kh = seq_head % a.num_kv_heads;
  r.q0 = a.query_start[r.s];
  r.qlen = a.query_start[r.s + 1] - r.q0;
  r.L = a.context_lens[r.s];
  r.rows = r.qlen * r.G;
  r.m0 = mtile * bm;
  const int i_lo = r.m0 / r.G, i_hi = min(r.qlen - 1, (r.m0 + bm - 1) / r.G);
  r.qpos_lo = a.window < 0 ? r.L - 1 : r.L - r.qlen + i_lo;
  r.qpos_hi = a.window < 0 ? r.L - 1 : r.L - r.qlen + i_hi;
  r.kv_end = r.qpos_hi + 1;
  r.kv_begin = (a.window > 0 ? max(0, r.qpos_lo - a.window + 1) : 0) / bn * bn;
  r.n_tiles = (r.kv_end - r.kv_begin + bn - 1) / bn;
  return r;
}

// The CTA's row tile of (sequence, kv head) blockIdx.y.
__device__ __forceinline__ CtaRange cta_range(const AttnLaunch& a, int mtile, int bm, int bn) {
  return cta_range(a, mtile, static_cast<int>(blockIdx.y), bm, bn);
}

// 16-byte chunk c of the q row behind the CTA's packed row m0 + row, or null past its rows.
template <int D, typename T>
__device__ __forceinline__ const T* q_chunk(const AttnLaunch& a, const CtaRange& r, const T* q,
                                            int row, int c) {
  const int pr = r.m0 + row;
  if (pr >= r.rows) return nullptr;
  return q + static_cast<int64_t>(r.q0 + pr / r.G) * a.q_stride +
         static_cast<int64_t>(r.kh * r.G + pr % r.G) * D + c * 8;
}

// Token slot (page * block_size + place in the page) of key j in a sequence's page table.
__device__ __forceinline__ int64_t kv_slot(const AttnLaunch& a, const int32_t* pages, int j) {
  int64_t page, slot;
  if (a.block_shift >= 0) {
    page = pages[j >> a.block_shift];
    slot = j & (a.block_size - 1);
  } else {
    page = pages[j / a.block_size];
    slot = j % a.block_size;
  }
  return page * a.block_size + slot;
}

// Element offset of key j's row (for kv head kh) in the paged cache.
__device__ __forceinline__ int64_t kv_row_offset(const AttnLaunch& a, const int32_t* pages, int j,
                                                 int kh) {
  return (kv_slot(a, pages, j) * a.num_kv_heads + kh) * a.head_dim;
}

// Token slot of the key behind chunk idx of a K/V tile that starts at key n0 (DC 16-byte chunks a
// row), or -1 past the context (an int: a cache of 2^31 token slots would not fit a GPU).
template <int DC>
__device__ __forceinline__ int tile_chunk_slot(const AttnLaunch& a, const int32_t* pages, int n0,
                                               int kv_end, int idx) {
  const int j = n0 + idx / DC;
  return j < kv_end ? static_cast<int>(kv_slot(a, pages, j)) : -1;
}

// A CTA's copy of one K/V tile into shared memory: kThreads threads, chunk idx = tid + i *
// kThreads (i < kIters) of the tile's rows. The rows' pages are looked up first, kGroup at a time
// as plain loads issued back to back, and then the copies are issued: a lookup written inside the
// copy loop waits behind the previous chunk's asynchronous copy, one memory round trip per row
// (on the H200, 64 x 4k-token decode attention read 3.2-3.5 TB/s so, 3.8-4.2 batched).
// slot(i): -1 past the context. copy(i, slot): issues chunk i's copies.
template <int kIters, int kGroup, typename Slot, typename Copy>
__device__ __forceinline__ void copy_tile_batched(Slot slot, Copy copy) {
  static_assert(kIters % kGroup == 0, "whole lookup groups");
#pragma unroll
  for (int g = 0; g < kIters; g += kGroup) {
    int sl[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) sl[i] = slot(g + i);
#pragma unroll
    for (int i = 0; i < kGroup; ++i) copy(g + i, sl[i]);
  }
}

// Writes columns col, col + 1 of output row `orow` (token * num_heads + head) from a CTA's
// running max m, sum l and unnormalised values v0, v1: with several splits, the partials of
// split `split` (m and l only where write_ml); otherwise the normalised output, sinks applied,
// through store(orow, head, col, v0, v1).
template <int D, typename Store>
__device__ __forceinline__ void write_attention_row(const AttnLaunch& a, int split, int splits,
                                                    int64_t orow, float m, float l, int col,
                                                    float v0, float v1, bool write_ml,
                                                    Store store) {
  if (splits > 1) {
    const int64_t pi = static_cast<int64_t>(split) * a.num_tokens * a.num_heads + orow;
    *reinterpret_cast<float2*>(a.part_o + pi * D + col) = make_float2(v0, v1);
    if (write_ml) {
      a.part_ml[pi * 2] = m;
      a.part_ml[pi * 2 + 1] = l;
    }
    return;
  }
  float oscale = 1.0f;
  const int head = static_cast<int>(orow % a.num_heads);
  if (a.sinks) {
    const float sink = a.sinks[head] * kLog2e;
    const float mf = fmaxf(m, sink);
    oscale = fast_exp2(m - mf);
    l = l * oscale + fast_exp2(sink - mf);
  }
  const float inv = oscale / l;
  store(orow, head, col, v0 * inv, v1 * inv);
}

// Decode mode: the block's warps hold softmax states (running max m, sum l, unnormalised values)
// of the same 16 rows over different keys, in mma.sync accumulator fragments. Each warp stores
// its state into shared memory (red: [warps][16][D] values, then [warps][16] maxima and sums;
// the value of fragment (dt, e) of row lane/4 + 8 (e/2) at dt * 8 + 2 (lane % 4) + e % 2), the
// block synchronises, and every (row, column pair) is merged over the warps and handed to
// write(orow, m, l, col, v0, v1), orow = out_row(row) (token * num_heads + head; rows where it is
// negative, padding, are skipped). The values of columns col and col + 1 sit at pos_of(col) and
// pos_of(col) + step (the kernel's fragment column order). o_at(dt, e), m_at(h), l_at(h): this
// thread's fragments and row states.
template <int D, int kWarps, typename OAt, typename MAt, typename LAt, typename OutRow,
          typename PosOf, typename Write>
__device__ __forceinline__ void merge_decode_warps(float* red, int tid, OAt o_at, MAt m_at,
                                                   LAt l_at, OutRow out_row, PosOf pos_of, int step,
                                                   Write write) {
  constexpr int DT = D / 8;
  float* red_o = red;                      // [warp][16][D]
  float* red_m = red_o + kWarps * 16 * D;  // [warp][16]
  float* red_l = red_m + kWarps * 16;
  const int lane = tid & 31, warp = tid >> 5;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = (lane >> 2) + h * 8;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<float2*>(red_o + (warp * 16 + row) * D + dt * 8 + 2 * (lane & 3)) =
          make_float2(o_at(dt, 2 * h), o_at(dt, 2 * h + 1));
    if ((lane & 3) == 0) {
      red_m[warp * 16 + row] = m_at(h);
      red_l[warp * 16 + row] = l_at(h);
    }
  }
  __syncthreads();
  for (int idx = tid; idx < 16 * (D / 2); idx += kWarps * 32) {
    const int row = idx / (D / 2), col = (idx % (D / 2)) * 2;
    const int64_t orow = out_row(row);
    if (orow < 0) continue;
    const int pos = pos_of(col);
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, red_m[w * 16 + row]);
    float l = 0.0f, v0 = 0.0f, v1 = 0.0f;
    if (m != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = fast_exp2(red_m[w * 16 + row] - m);
        l += f * red_l[w * 16 + row];
        v0 += f * red_o[(w * 16 + row) * D + pos];
        v1 += f * red_o[(w * 16 + row) * D + pos + step];
      }
    }
    write(orow, m, l, col, v0, v1);
  }
}

// After a decode split CTA has written its partials (a.part_ml, a.part_o) for its 16 rows: the
// last of the sequence's `splits` CTAs to finish merges every split's partials with the sinks and
// stores each output value through store(orow, head, col, value); the others return. The merging
// CTA resets the sequence's counter for the next launch. out_row_of(row) is token * num_heads +
// head for the CTA's row m0 + row, or -1 for padding.
template <int D, int kThreads, typename RowOf, typename Store>
__device__ __forceinline__ void merge_splits_if_last(const AttnLaunch& a, int splits, int m0,
                                                     int tid, RowOf out_row_of, Store store) {
  __shared__ int is_last;
  __threadfence();  // this CTA's partials are visible before its ticket
  __syncthreads();
  if (tid == 0) is_last = atomicAdd(a.counters + blockIdx.y, 1) == splits - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  const int64_t rows_total = a.num_tokens * a.num_heads;
  for (int idx = tid; idx < 16 * D; idx += kThreads) {
    const int row = idx / D, col = idx % D;
    const int64_t orow = out_row_of(m0 + row);
    if (orow < 0) continue;
    const int head = static_cast<int>(orow % a.num_heads);
    float mx = a.sinks ? a.sinks[head] * kLog2e : -INFINITY;
    for (int sp = 0; sp < splits; ++sp)
      mx = fmaxf(mx, __ldcg(a.part_ml + (sp * rows_total + orow) * 2));
    float denom = a.sinks ? fast_exp2(a.sinks[head] * kLog2e - mx) : 0.0f, acc = 0.0f;
    for (int sp = 0; sp < splits; ++sp) {
      const int64_t pi = sp * rows_total + orow;
      const float f = fast_exp2(__ldcg(a.part_ml + pi * 2) - mx);
      denom += f * __ldcg(a.part_ml + pi * 2 + 1);
      acc += f * __ldcg(a.part_o + pi * D + col);
    }
    store(orow, head, col, acc / denom);
  }
  if (tid == 0) a.counters[blockIdx.y] = 0;  // ready for the next launch
}

}  // namespace atom::kernels::cuda
