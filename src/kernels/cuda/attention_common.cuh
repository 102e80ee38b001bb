// Pieces shared by the attention kernels: where a CTA's rows and keys lie, paged K/V addressing,
// the decode split rule (the flash kernel and the combine kernel must agree on it).
#pragma once

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/mma.cuh"

namespace atom::kernels::cuda {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr int kDecodeBlockN = 64;  // keys per tile in decode mode
// A decode split covers at least 256 keys: below that, merging the splits' partials (a
// threadfence, a ticket and a pass over the partials) costs more than the tiles it parallelises.
inline constexpr int kMinTilesPerSplit = 4;

// Splits a sequence of n_tiles key tiles actually uses out of the launch's num_splits.
__device__ __forceinline__ int decode_splits(int n_tiles, int num_splits) {
  const int by_len = (n_tiles + kMinTilesPerSplit - 1) / kMinTilesPerSplit;
  return max(1, min(num_splits, by_len));
}

// The rows [m0, m0 + bm) of sequence s's packed (token * G + head_in_group) rows for kv head kh,
// and the key tiles of width bn they attend to.
struct CtaRange {
  int s, kh, G, q0, qlen, L, rows, m0;
  int qpos_lo, qpos_hi;  // query positions of the first and last token of the CTA's rows
  int kv_begin, kv_end, n_tiles;
};

__device__ __forceinline__ CtaRange cta_range(const AttnLaunch& a, int mtile, int bm, int bn) {
  CtaRange r;
  r.G = a.num_heads / a.num_kv_heads;
  r.s = blockIdx.y / a.num_kv_heads;
  r.kh = blockIdx.y % a.num_kv_heads;
  r.q0 = a.query_start[r.s];
  r.qlen = a.query_start[r.s + 1] - r.q0;
  r.L = a.context_lens[r.s];
  r.rows = r.qlen * r.G;
  r.m0 = mtile * bm;
  const int i_lo = r.m0 / r.G, i_hi = min(r.qlen - 1, (r.m0 + bm - 1) / r.G);
  r.qpos_lo = r.L - r.qlen + i_lo;
  r.qpos_hi = r.L - r.qlen + i_hi;
  r.kv_end = r.qpos_hi + 1;
  r.kv_begin = (a.window > 0 ? max(0, r.qpos_lo - a.window + 1) : 0) / bn * bn;
  r.n_tiles = (r.kv_end - r.kv_begin + bn - 1) / bn;
  return r;
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

// Element offset of key j's row (for kv head kh) in the paged cache.
__device__ __forceinline__ int64_t kv_row_offset(const AttnLaunch& a, const int32_t* pages, int j,
                                                 int kh) {
  int64_t page, slot;
  if (a.block_shift >= 0) {
    page = pages[j >> a.block_shift];
    slot = j & (a.block_size - 1);
  } else {
    page = pages[j / a.block_size];
    slot = j % a.block_size;
  }
  return ((page * a.block_size + slot) * a.num_kv_heads + kh) * a.head_dim;
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
