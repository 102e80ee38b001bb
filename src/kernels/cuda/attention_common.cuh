// Pieces shared by the attention kernels: where a CTA's rows and keys lie, paged K/V addressing,
// the decode split rule (the flash kernel and the combine kernel must agree on it).
#pragma once

#include "kernels/cuda/device_common.cuh"

namespace atom::kernels::cuda {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr int kDecodeBlockN = 64;     // keys per tile in decode mode
inline constexpr int kMinTilesPerSplit = 2;  // a decode split covers at least 128 keys

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

}  // namespace atom::kernels::cuda
