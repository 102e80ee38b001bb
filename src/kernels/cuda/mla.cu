// Multi-head latent attention's small kernels (RoPE and the latent cache write, one-row cache
// writes, the indexer's LayerNorm), the FP32 reference-shape latent attention for any width, and
// the sparse-attention indexer (scores, then a per-token radix select and sort).
#include <algorithm>
#include <atomic>

#include "kernels/cuda/device_common.cuh"
#include "kernels/index_plane_rows.h"

namespace atom::kernels::cuda {

namespace {

// Element offset of context position j's row in a one-row-per-token cache of `width`.
__device__ __forceinline__ int64_t cache_row(const int32_t* pages, int bs, int j, int width) {
  return (static_cast<int64_t>(pages[j / bs]) * bs + j % bs) * width;
}

__device__ __forceinline__ int ebytes(Elem e) { return e == Elem::kF32 ? 4 : 2; }

constexpr int kRopeThreads = 128;

__global__ void __launch_bounds__(kRopeThreads) mla_rope_kernel(MlaRopeLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float table[];  // cos [R / 2], sin [R / 2]
  const int64_t t = blockIdx.x;
  const int half = a.rope_dim / 2, H = a.num_heads, N = a.nope_dim, R = a.rope_dim;
  float* cs = table;
  float* sn = table + half;
  const float pos = static_cast<float>(a.positions[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x)
    rope_cos_sin(pos, a.inv_freq[i], a.scale, cs[i], sn[i]);
  __syncthreads();
  char* qrow = row_of(a.q, t);
  char* kvrow = row_of(a.kv, t);
  for (int p = threadIdx.x; p < (H + 1) * half; p += blockDim.x) {
    const int h = p / half, i = p % half;
    const int64_t base = h < H ? static_cast<int64_t>(h) * (N + R) + N : a.latent_dim;
    char* row = h < H ? qrow : kvrow;
    const Elem et = h < H ? a.q.type : a.kv.type;
    const int64_t i1 = base + (a.interleaved ? 2 * i : i);
    const int64_t i2 = base + (a.interleaved ? 2 * i + 1 : i + half);
    float y1, y2;
    rope_rotate(load_elem(row, et, i1), load_elem(row, et, i2), cs[i], sn[i], y1, y2);
    store_elem(row, et, i1, y1);
    store_elem(row, et, i2, y2);
  }
  const int64_t slot = a.slot_mapping[t];
  if (slot < 0 || slot >= a.num_slots) return;
  __syncthreads();  // the rotated k_pe (global writes, visible in the block)
  const int64_t W = a.kv.cols;
  for (int64_t i = threadIdx.x; i < W; i += blockDim.x)
    store_elem(a.cache, a.cache_type, slot * W + i, load_elem(kvrow, a.kv.type, i));
}

__global__ void __launch_bounds__(128)
    cache_rows_kernel(void* cache, Elem ct, int64_t num_slots, Mat rows, const int32_t* slots) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];  // the batch layout: written before the step
  pdl_wait();
  pdl_launch_dependents();
  if (slot < 0 || slot >= num_slots) return;
  const char* r = row_of(rows, t);
  for (int64_t i = threadIdx.x; i < rows.cols; i += blockDim.x)
    store_elem(cache, ct, slot * rows.cols + i, load_elem(r, rows.type, i));
}

__global__ void __launch_bounds__(256)
    layer_norm_kernel(Mat out, Mat x, const void* w, const void* b, Elem wt, float eps) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x, dim = x.cols;
  const char* xr = row_of(x, r);
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) s += load_elem(xr, x.type, i);
  const float mean = block_sum(s, scratch) / static_cast<float>(dim);
  float v = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float d = load_elem(xr, x.type, i) - mean;
    v += d * d;
  }
  const float inv = 1.0f / sqrtf(block_sum(v, scratch) / static_cast<float>(dim) + eps);
  // x and out may alias: every thread has read its elements above (block_sum's barriers).
  char* orow = row_of(out, r);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float y = (load_elem(xr, x.type, i) - mean) * inv * load_elem(w, wt, i) +
                    (b ? load_elem(b, wt, i) : 0.0f);
    store_elem(orow, out.type, i, y);
  }
}

// ---- latent attention, FP32, one block of four warps per (token, head)
constexpr int kSimpleWarps = 4;
constexpr int kSimplePerLane = kMlaSimpleMaxLatent / 32;

__global__ void __launch_bounds__(32 * kSimpleWarps) mla_simple_kernel(MlaLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float qv[kMlaSimpleMaxWidth];
  __shared__ float red_ml[kSimpleWarps][2];
  __shared__ float red_acc[kSimpleWarps][kMlaSimpleMaxLatent];
  const int H = a.num_heads, L = a.latent_dim, W = a.latent_dim + a.rope_dim;
  const int64_t t = blockIdx.x / H;
  const int h = static_cast<int>(blockIdx.x % H);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int s = seq_of_row(a.query_start, a.num_seqs, static_cast<int>(t));
  const int q0 = a.query_start[s], ql = a.query_start[s + 1] - q0;
  const int qpos = a.context_lens[s] - ql + (static_cast<int>(t) - q0);
  const int32_t* pages = a.page_indices + a.page_indptr[s];
  const char* qrow = static_cast<const char*>(a.q) + t * a.q_stride * ebytes(a.type);
  for (int d = threadIdx.x; d < W; d += blockDim.x)
    qv[d] = load_elem(qrow, a.type, static_cast<int64_t>(h) * W + d);
  __syncthreads();
  float m = -INFINITY, l = 0.0f, acc[kSimplePerLane];
#pragma unroll
  for (int i = 0; i < kSimplePerLane; ++i) acc[i] = 0.0f;
  const int nkeys = a.topk ? a.top_k : qpos + 1;
  for (int k = warp; k < nkeys; k += kSimpleWarps) {
    const int j = a.topk ? a.topk[t * a.top_k + k] : k;
    if (j < 0 || j > qpos) continue;  // warp-uniform
    const int64_t row = cache_row(pages, a.block_size, j, W);
    float dot = 0.0f;
    for (int d = lane; d < W; d += 32) dot += qv[d] * load_elem(a.cache, a.cache_type, row + d);
    dot = warp_sum(dot) * a.scale;
    const float m_new = fmaxf(m, dot);
    const float corr = expf(m - m_new), p = expf(dot - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kSimplePerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < L) acc[i] = acc[i] * corr + p * load_elem(a.cache, a.cache_type, row + d);
    }
    m = m_new;
  }
  if (lane == 0) {
    red_ml[warp][0] = m;
    red_ml[warp][1] = l;
  }
#pragma unroll
  for (int i = 0; i < kSimplePerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < L) red_acc[warp][d] = acc[i];
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int w = 0; w < kSimpleWarps; ++w) mx = fmaxf(mx, red_ml[w][0]);
  float f[kSimpleWarps], denom = 0.0f;
  for (int w = 0; w < kSimpleWarps; ++w) {
    f[w] = red_ml[w][0] == -INFINITY ? 0.0f : expf(red_ml[w][0] - mx);
    denom += f[w] * red_ml[w][1];
  }
  char* orow = static_cast<char*>(a.out) + t * a.out_stride * ebytes(a.type);
  for (int d = threadIdx.x; d < L; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kSimpleWarps; ++w) o += f[w] * red_acc[w][d];
    store_elem(orow, a.type, static_cast<int64_t>(h) * L + d, denom > 0.0f ? o / denom : 0.0f);
  }
}

// ---- the indexer
constexpr int kScoreThreads = 128;

// One thread per visible position j of token blockIdx.x (a tile of kScoreThreads positions per
// blockIdx.y): score_j = sum_h (w_h * weights_scale) * relu(scale * q_h . k_j), heads and dims in
// ascending order as the CPU reference sums them.
__global__ void __launch_bounds__(kScoreThreads) indexer_score_kernel(IndexerLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float sm[];
  const int Hi = a.num_heads, D = a.head_dim;
  float* qs = sm;           // [Hi * D]
  float* ws = qs + Hi * D;  // [Hi]
  float* ks = ws + Hi;      // [kScoreThreads][D + 1]
  const int64_t t = blockIdx.x;
  const int s = seq_of_row(a.query_start, a.num_seqs, static_cast<int>(t));
  const int q0 = a.query_start[s], ql = a.query_start[s + 1] - q0;
  const int n = (a.context_lens[s] - ql + (static_cast<int>(t) - q0) + 1) / a.pool;
  const int j0 = blockIdx.y * kScoreThreads;
  if (j0 >= n) return;
  const char* qrow = static_cast<const char*>(a.q) + t * a.q_stride * ebytes(a.q_type);
  for (int i = threadIdx.x; i < Hi * D; i += blockDim.x) qs[i] = load_elem(qrow, a.q_type, i);
  for (int i = threadIdx.x; i < Hi; i += blockDim.x)
    ws[i] = a.weights[t * a.weights_stride + i] * a.weights_scale;
  const int32_t* pages = a.page_indices + a.page_indptr[s];
  if (a.key_format != 0) {
    // Each head rounded as the scorers take it (kernels/index_plane.h, the CPU's code).
    __syncthreads();
    if (a.key_format == 1) {
      for (int h = threadIdx.x; h < Hi; h += blockDim.x) index_fp8_round_query(qs + h * D, D);
    } else {
      for (int g = threadIdx.x; g < Hi * D / 32; g += blockDim.x)
        index_fp4_round_query(qs + g * 32, 32);
    }
  }
  // The tile's key rows, coalesced: thread i loads element i of consecutive rows.
  const int rows = min(kScoreThreads, n - j0);
  if (a.key_format == 0) {
    for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
      const int r = e / D, d = e % D;
      ks[r * (D + 1) + d] =
          a.pooled
              ? a.pooled[(static_cast<int64_t>(s) * a.max_context_len + j0 + r) * D + d]
              : load_elem(a.cache, a.cache_type, cache_row(pages, a.block_size, j0 + r, D) + d);
    }
  } else {
    const uint8_t* cache = static_cast<const uint8_t*>(a.cache);
    for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
      const int r = e / D, d = e % D;
      const int64_t base = cache_row(pages, a.block_size, j0 + r, a.key_width);
      float v;
      if (a.key_format == 1) {
        float scale;
        memcpy(&scale, cache + base + D, 4);
        v = f8e4m3_to_f32(cache[base + d]) * scale;
      } else {
        const uint8_t b = cache[base + d / 2];
        const int sc = a.key_scales[base / a.key_width * (D / 32) + d / 32];
        v = index_plane::e2m1_value(d % 2 ? static_cast<uint8_t>(b >> 4)
                                          : static_cast<uint8_t>(b & 15u)) *
            index_plane::pow2f(sc - 127);
      }
      ks[r * (D + 1) + d] = v;
    }
  }
  __syncthreads();
  const int j = j0 + threadIdx.x;
  if (j >= n) return;
  if (a.cand_in) {  // a row outside the candidate blocks is not chosen (NaN: key 0)
    const int32_t* ci = a.cand_in + t * a.cand_in_count;
    bool ok = false;
    for (int c = 0; c < a.cand_in_count && !ok; ++c) ok = ci[c] >= 0 && ci[c] == j / a.cand_block;
    if (!ok) {
      a.scores[t * a.max_context_len + j] = __int_as_float(0x7fc00000);
      return;
    }
  }
  const float* k = ks + threadIdx.x * (D + 1);
  float sum = 0.0f;
  for (int h = 0; h < Hi; ++h) {
    float dot = 0.0f;
    for (int d = 0; d < D; ++d) dot += qs[h * D + d] * k[d];
    sum += ws[h] * fmaxf(dot * a.scale, 0.0f);
  }
  a.scores[t * a.max_context_len + j] = sum;
}

constexpr int kTopkThreads = 1024;

// Order-preserving key of a score: larger scores give larger keys, -0 equals +0, NaN sorts last.
__device__ __forceinline__ uint32_t score_key(float f) {
  if (f != f) return 0u;
  if (f == 0.0f) f = 0.0f;
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// One block per token: the top_k of its n scores (radix select on the keys; ties at the
// threshold taken in position order), then a bitonic sort of the chosen by (score desc,
// position asc), as the CPU's partial_sort orders them.
__global__ void __launch_bounds__(kTopkThreads) indexer_select_kernel(IndexerLaunch a, int sort_n) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ unsigned long long buf[];  // [sort_n]
  __shared__ int hist[256];
  __shared__ int sel_digit, remaining, n_gt, warp_counts[32];
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x, K = a.top_k;
  const int s = seq_of_row(a.query_start, a.num_seqs, static_cast<int>(t));
  const int q0 = a.query_start[s], ql = a.query_start[s + 1] - q0;
  const int n = (a.context_lens[s] - ql + (static_cast<int>(t) - q0) + 1) / a.pool;
  const float* sc = a.scores + t * a.max_context_len;
  const bool large = a.large_position_first;
  // Ties sort by position: the lower first, or with large_position_first the higher.
  auto composite = [large](uint32_t key, int j) {
    return (static_cast<unsigned long long>(key) << 32) |
           (large ? static_cast<uint32_t>(j) : 0xFFFFFFFFu - static_cast<uint32_t>(j));
  };
  for (int i = tid; i < sort_n; i += blockDim.x) buf[i] = 0ull;
  __syncthreads();
  const int keep = min(n, K);
  if (n <= K) {
    for (int j = tid; j < n; j += blockDim.x) buf[j] = composite(score_key(sc[j]), j);
  } else {
    uint32_t prefix = 0, mask = 0;
    if (tid == 0) remaining = K;
    for (int pass = 0; pass < 4; ++pass) {
      const int shift = 24 - 8 * pass;
      for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      for (int j = tid; j < n; j += blockDim.x) {
        const uint32_t key = score_key(sc[j]);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
      }
      __syncthreads();
      if (tid == 0) {
        int above = 0, d = 255;
        for (; d > 0; --d) {
          if (above + hist[d] >= remaining) break;
          above += hist[d];
        }
        sel_digit = d;
        remaining -= above;
      }
      __syncthreads();
      prefix |= static_cast<uint32_t>(sel_digit) << shift;
      mask |= 255u << shift;
    }
    const uint32_t theta = prefix;
    const int need_ties = remaining;  // keys equal to theta to take, lowest positions first
    if (tid == 0) n_gt = 0;
    __syncthreads();
    for (int j = tid; j < n; j += blockDim.x) {
      const uint32_t key = score_key(sc[j]);
      if (key > theta) buf[atomicAdd(&n_gt, 1)] = composite(key, j);
    }
    __syncthreads();
    const int gt = n_gt;  // == K - need_ties
    int taken = 0;
    const int lane = tid & 31, warp = tid >> 5;
    for (int j0 = 0; j0 < n && taken < need_ties; j0 += blockDim.x) {
      const int j = large ? n - 1 - (j0 + tid) : j0 + tid;
      const bool tie = j0 + tid < n && score_key(sc[j]) == theta;
      const unsigned ballot = __ballot_sync(0xffffffffu, tie);
      if (lane == 0) warp_counts[warp] = __popc(ballot);
      __syncthreads();
      int before = taken;
      for (int w = 0; w < warp; ++w) before += warp_counts[w];
      before += __popc(ballot & ((1u << lane) - 1u));
      if (tie && before < need_ties) buf[gt + before] = composite(theta, j);
      int total = 0;
      for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += warp_counts[w];
      __syncthreads();
      taken += total;
    }
  }
  __syncthreads();
  for (int k = 2; k <= sort_n; k <<= 1)
    for (int jj = k >> 1; jj > 0; jj >>= 1) {
      for (int i = tid; i < sort_n; i += blockDim.x) {
        const int ixj = i ^ jj;
        if (ixj > i) {
          const unsigned long long x = buf[i], y = buf[ixj];
          if ((i & k) == 0 ? x < y : x > y) {
            buf[i] = y;
            buf[ixj] = x;
          }
        }
      }
      __syncthreads();
    }
  int32_t* out = a.topk + t * K;
  for (int k = tid; k < K; k += blockDim.x) {
    const uint32_t low = static_cast<uint32_t>(buf[k]);
    // Rows outside the candidate blocks (key 0) are never chosen.
    const bool excluded = a.cand_in && (buf[k] >> 32) == 0;
    out[k] = k < keep && !excluded ? static_cast<int32_t>(large ? low : 0xFFFFFFFFu - low) : -1;
  }
}

// The candidate blocks of token blockIdx.x (IndexerLaunch::cand_out): each block's maximum
// score over the visible rows (the newest block +inf), then the cand_out_count best (maximum
// descending, the lower block first) by repeated arg-max, written in ascending order.
__global__ void __launch_bounds__(256) indexer_candidates_kernel(IndexerLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float best_v[256];
  __shared__ int best_b[256];
  __shared__ int chosen[1024];
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x, B = a.cand_block, C = a.cand_out_count;
  const int s = seq_of_row(a.query_start, a.num_seqs, static_cast<int>(t));
  const int q0 = a.query_start[s], ql = a.query_start[s + 1] - q0;
  const int n = (a.context_lens[s] - ql + (static_cast<int>(t) - q0) + 1) / a.pool;
  const int nb = (n + B - 1) / B;
  const float* sc = a.scores + t * a.max_context_len;
  float* bm = a.block_max + t * a.max_blocks;
  for (int blk = tid; blk < nb; blk += blockDim.x) {
    float m = -INFINITY;
    for (int j = blk * B; j < min(n, (blk + 1) * B); ++j) m = fmaxf(m, sc[j]);
    bm[blk] = blk == nb - 1 ? INFINITY : m;
  }
  __syncthreads();
  const int k = min(C, nb);
  for (int c = 0; c < k; ++c) {
    // NaN marks a block already taken.
    float v = 0.0f;
    int bi = -1;
    for (int blk = tid; blk < nb; blk += blockDim.x) {
      const float x = bm[blk];
      if (x != x) continue;
      if (bi < 0 || x > v) v = x, bi = blk;
    }
    best_v[tid] = v;
    best_b[tid] = bi;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
      if (tid < w) {
        const int ob = best_b[tid + w];
        const float ov = best_v[tid + w];
        const int mb = best_b[tid];
        if (ob >= 0 && (mb < 0 || ov > best_v[tid] || (ov == best_v[tid] && ob < mb))) {
          best_v[tid] = ov;
          best_b[tid] = ob;
        }
      }
      __syncthreads();
    }
    if (tid == 0) {
      chosen[c] = best_b[0];
      bm[best_b[0]] = __int_as_float(0x7fc00000);
    }
    __syncthreads();
  }
  if (tid == 0)  // ascending (insertion sort of at most 1,024)
    for (int i = 1; i < k; ++i) {
      const int x = chosen[i];
      int j = i - 1;
      for (; j >= 0 && chosen[j] > x; --j) chosen[j + 1] = chosen[j];
      chosen[j + 1] = x;
    }
  __syncthreads();
  for (int i = tid; i < C; i += blockDim.x) a.cand_out[t * C + i] = i < k ? chosen[i] : -1;
}

// The k-pool indexer's pooled keys: block (pool j, sequence s), a thread per channel; pools not
// complete by the sequence's last token are skipped.
__global__ void kpool_pool_kernel(IndexerLaunch a, const float* ape, float* pooled) {
  pdl_wait();
  pdl_launch_dependents();
  const int s = blockIdx.y, j = blockIdx.x, P = a.pool, D = a.head_dim;
  if (j >= a.context_lens[s] / P) return;
  const int32_t* pages = a.page_indices + a.page_indptr[s];
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float mx = -INFINITY;
    for (int u = 0; u < P; ++u)
      mx = fmaxf(mx, load_elem(a.cache, a.cache_type,
                               cache_row(pages, a.block_size, j * P + u, 2 * D) + D + d) +
                         ape[u * D + d]);
    float sum = 0.0f, acc = 0.0f;
    for (int u = 0; u < P; ++u) {
      const int64_t row = cache_row(pages, a.block_size, j * P + u, 2 * D);
      const float e = expf(load_elem(a.cache, a.cache_type, row + D + d) + ape[u * D + d] - mx);
      sum += e;
      acc += e * load_elem(a.cache, a.cache_type, row + d);
    }
    pooled[(static_cast<int64_t>(s) * a.max_context_len + j) * D + d] = acc / sum;
  }
}

// A block per token: its chosen pools (a.topk, -1 past the last) as positions, then the tail.
__global__ void kpool_expand_kernel(IndexerLaunch a, int32_t* out, int width, bool tail) {
  pdl_wait();
  pdl_launch_dependents();
  const int t = blockIdx.x, P = a.pool;
  const int s = seq_of_row(a.query_start, a.num_seqs, t);
  const int q0 = a.query_start[s], ql = a.query_start[s + 1] - q0;
  const int i = a.context_lens[s] - ql + (t - q0), n = (i + 1) / P;
  const int take = min(n, a.top_k), tail_len = tail ? i - n * P + 1 : 0;
  const int32_t* pools = a.topk + static_cast<int64_t>(t) * a.top_k;
  for (int e = threadIdx.x; e < width; e += blockDim.x) {
    int v = -1;
    if (e < take * P)
      v = pools[e / P] * P + e % P;
    else if (e - take * P < tail_len)
      v = n * P + (e - take * P);
    out[static_cast<int64_t>(t) * width + e] = v;
  }
}

std::atomic<uint64_t> g_score_smem{0}, g_select_smem{0};

}  // namespace

void launch_mla_rope_cache_write(const MlaRopeLaunch& a, cudaStream_t s) {
  if (a.q.rows == 0) return;
  launch(mla_rope_kernel, static_cast<unsigned>(a.q.rows), kRopeThreads,
         static_cast<size_t>(a.rope_dim) * sizeof(float), s, a);
}

void launch_cache_rows_write(void* cache, Elem ct, int64_t num_slots, Mat rows,
                             const int32_t* slot_mapping, cudaStream_t s) {
  if (rows.rows == 0) return;
  launch(cache_rows_kernel, static_cast<unsigned>(rows.rows), 128, 0, s, cache, ct, num_slots, rows,
         slot_mapping);
}

void launch_layer_norm(Mat out, Mat x, const void* w, const void* b, Elem wt, float eps,
                       cudaStream_t s) {
  if (x.rows == 0) return;
  launch(layer_norm_kernel, static_cast<unsigned>(x.rows), 256, 0, s, out, x, w, b, wt, eps);
}

void launch_mla_attention_simple(const MlaLaunch& a, cudaStream_t s) {
  if (a.num_tokens == 0) return;
  launch(mla_simple_kernel, static_cast<unsigned>(a.num_tokens * a.num_heads), 32 * kSimpleWarps, 0,
         s, a);
}

void launch_indexer_topk(const IndexerLaunch& a, cudaStream_t s) {
  if (a.num_tokens == 0) return;
  const int score_smem =
      (a.num_heads * a.head_dim + a.num_heads + kScoreThreads * (a.head_dim + 1)) * 4;
  max_dynamic_smem_once(g_score_smem, indexer_score_kernel, 200 * 1024);
  const unsigned tiles =
      static_cast<unsigned>((a.max_context_len + kScoreThreads - 1) / kScoreThreads);
  launch(indexer_score_kernel, dim3(static_cast<unsigned>(a.num_tokens), tiles ? tiles : 1),
         kScoreThreads, static_cast<size_t>(score_smem), s, a);
  if (a.cand_out)
    launch(indexer_candidates_kernel, static_cast<unsigned>(a.num_tokens), 256, 0, s, a);
  int sort_n = 1;
  while (sort_n < a.top_k) sort_n <<= 1;
  max_dynamic_smem_once(g_select_smem, indexer_select_kernel,
                        kIndexerMaxTopK * static_cast<int>(sizeof(unsigned long long)));
  launch(indexer_select_kernel, static_cast<unsigned>(a.num_tokens), kTopkThreads,
         static_cast<size_t>(sort_n) * sizeof(unsigned long long), s, a, sort_n);
}

void launch_kpool_topk(const IndexerLaunch& a, const float* ape, float* pooled, int32_t* out,
                       int width, bool tail, cudaStream_t s) {
  if (a.num_tokens == 0) return;
  launch(kpool_pool_kernel,
         dim3(static_cast<unsigned>(a.max_context_len), static_cast<unsigned>(a.num_seqs)), 128, 0,
         s, a, ape, pooled);
  IndexerLaunch pools = a;
  pools.pooled = pooled;
  launch_indexer_topk(pools, s);
  launch(kpool_expand_kernel, static_cast<unsigned>(a.num_tokens), 128, 0, s, a, out, width, tail);
}

}  // namespace atom::kernels::cuda
