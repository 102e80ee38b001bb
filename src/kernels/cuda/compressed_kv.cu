// DeepSeek-V4's attention kernels (kernels/compressed_kv.h): per-head norm and RoPE, the window
// compressor's pooling and its entries' norm and RoPE, the sink attention over the sliding window
// plus compressed entries, and the hash layers' table lookup. Each reads the batch from the
// device (a decode step replays in a CUDA graph) and computes in fp32 as the CPU code does.
#include <algorithm>

#include "kernels/cuda/compressed_kv_launch.h"
#include "kernels/cuda/device_common.cuh"

namespace atom::kernels::cuda {

namespace {

// Context index of token t (the cache index of the row it writes).
__device__ __forceinline__ int context_index(const CkvBatch& b, int t, int* seq) {
  const int s = seq_of_row(b.query_start, b.num_seqs, t);
  *seq = s;
  const int q0 = b.query_start[s], ql = b.query_start[s + 1] - q0;
  return b.context_lens[s] - ql + (t - q0);
}

// Element offset of the row of window w (tokens_per_row tokens) in a plane of rows_per_page rows
// a page and `width` channels: the page of the window's last token.
__device__ __forceinline__ int64_t window_row(const int32_t* pages, int block_size,
                                              int tokens_per_row, int rows_per_page, int64_t w,
                                              int width) {
  const int64_t last = w * tokens_per_row + tokens_per_row - 1;
  const int64_t page = pages[last / block_size];
  const int64_t r = (last % block_size) / tokens_per_row;
  return (page * rows_per_page + r) * width;
}

// RoPE of the pairs of v[D - R .. D) in shared memory (interleaved), in place, by the block.
__device__ __forceinline__ void rope_tail_shared(float* v, int D, int R, float pos,
                                                 const float* inv_freq, float af, bool inverse) {
  float* r = v + (D - R);
  for (int i = threadIdx.x; i < R / 2; i += blockDim.x) {
    float c, s;
    rope_cos_sin(pos, inv_freq[i], af, c, s);
    if (inverse) s = -s;
    float y0, y1;
    rope_rotate(r[2 * i], r[2 * i + 1], c, s, y0, y1);
    r[2 * i] = y0;
    r[2 * i + 1] = y1;
  }
}

constexpr int kThreads = 128;

// Block per token: each head loaded to shared memory, normalised (optionally), rotated, stored.
__global__ void __launch_bounds__(kThreads) heads_norm_rope_kernel(HeadsRopeLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float v[];  // [head_dim]
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const int D = a.head_dim;
  char* row = row_of(a.x, t);
  const float pos = static_cast<float>(a.positions[t]);
  for (int h = 0; h < a.heads; ++h) {
    const int64_t base = static_cast<int64_t>(h) * D;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      const float x = load_elem(row, a.x.type, base + d);
      v[d] = x;
      ss += x * x;
    }
    if (a.norm) {
      const float total = block_sum(ss, red);
      const float inv = 1.0f / sqrtf(total / static_cast<float>(D) + a.norm_eps);
      for (int d = threadIdx.x; d < D; d += blockDim.x) v[d] *= inv;
    }
    __syncthreads();
    if (a.rot_dim > 0)
      rope_tail_shared(v, D, a.rot_dim, pos, a.inv_freq, a.attention_factor, a.inverse != 0);
    __syncthreads();
    for (int d = threadIdx.x; d < D; d += blockDim.x) store_elem(row, a.x.type, base + d, v[d]);
    __syncthreads();
  }
}

// One window's online softmax of one channel: running max, sum of exp, sum of exp · value.
struct Pool1 {
  float m, s, a;
  __device__ void clear() {
    m = -INFINITY;
    s = 0.0f;
    a = 0.0f;
  }
  __device__ void add(float z, float c) {
    const float mx = fmaxf(m, z);
    const float keep = expf(m - mx), e = expf(z - mx);
    s = s * keep + e;
    a = a * keep + e * c;
    m = mx;
  }
};

// Block (sequence, 128 channels): a thread per channel walks the sequence's new tokens in order
// (the online softmax is sequential in the tokens), writing each completed window's pooled value
// to scratch at the completing token's row. The state carries the windows in progress.
__global__ void __launch_bounds__(kThreads) window_pool_kernel(WindowPoolLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  const int s = blockIdx.x, D = a.head_dim, r = a.ratio;
  const int d = blockIdx.y * blockDim.x + threadIdx.x;
  if (d >= D) return;
  const int q0 = a.b.query_start[s], q1 = a.b.query_start[s + 1];
  const int slot = a.b.state_slots[s];
  if (q0 == q1 || slot < 0) return;  // slot -1: a decode graph's padding sequence
  const int start = a.b.context_lens[s] - (q1 - q0);
  const int width = a.overlap ? 2 * D : D;
  const int slot_floats = (a.overlap ? 6 : 3) * D;
  float* st = a.state + static_cast<int64_t>(slot) * slot_floats;
  Pool1 cur{st[d], st[D + d], st[2 * D + d]}, next{-INFINITY, 0.0f, 0.0f};
  if (a.overlap) next = Pool1{st[3 * D + d], st[4 * D + d], st[5 * D + d]};
  // This channel of the windows in progress into a state slot.
  auto store = [&](float* to) {
    to[d] = cur.m;
    to[D + d] = cur.s;
    to[2 * D + d] = cur.a;
    if (a.overlap) {
      to[3 * D + d] = next.m;
      to[4 * D + d] = next.s;
      to[5 * D + d] = next.a;
    }
  };
  for (int i = q0; i < q1; ++i) {
    const int p = start + (i - q0), j = p % r;
    if (p == 0) {
      cur.clear();
      next.clear();
    }
    const char* kv = row_of(a.kv, i);
    const char* g = a.gate.data ? row_of(a.gate, i) : nullptr;
    auto z_of = [&](int c) {
      return (g ? load_elem(g, a.gate.type, c) : 0.0f) + (a.ape ? a.ape[j * width + c] : 0.0f);
    };
    if (a.overlap) {
      cur.add(z_of(D + d), load_elem(kv, a.kv.type, D + d));  // Cb: this window's entry
      next.add(z_of(d), load_elem(kv, a.kv.type, d));         // Ca: the next window's
    } else {
      cur.add(z_of(d), load_elem(kv, a.kv.type, d));
    }
    if (j == r - 1) {  // the window is complete: its pooled values, and the next one begins
      a.scratch[static_cast<int64_t>(i) * D + d] = cur.a / cur.s;
      if (a.overlap) {
        cur = next;
        next.clear();
      } else {
        cur.clear();
      }
    }
    // A verification row's rollback slot takes the windows in progress after the row.
    const int keep = a.b.rollback_slots ? a.b.rollback_slots[i] : -1;
    if (keep >= 0) store(a.state + static_cast<int64_t>(keep) * slot_floats);
  }
  store(st);
}

// Block per token: a window its token completes gets the weighted RMSNorm and RoPE at the
// window's first position, into its row of the plane.
__global__ void __launch_bounds__(kThreads) window_finish_kernel(WindowPoolLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float v[];  // [head_dim]
  __shared__ float red[32];
  const int t = blockIdx.x, D = a.head_dim, r = a.ratio;
  int s;
  const int p = context_index(a.b, t, &s);
  if ((p + 1) % r != 0 || a.b.state_slots[s] < 0) return;  // no window ends here, or padding
  const float* e = a.scratch + static_cast<int64_t>(t) * D;
  float ss = 0.0f;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    v[d] = e[d];
    ss += e[d] * e[d];
  }
  const float total = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(D) + a.norm_eps);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    v[d] = a.norm_w[d] * (v[d] * inv);
    if (a.keep_latent) a.scratch[static_cast<int64_t>(t) * D + d] = v[d];  // read by now
  }
  __syncthreads();
  const int64_t w = p / r;
  if (a.rot_dim > 0)
    rope_tail_shared(v, D, a.rot_dim, static_cast<float>(w * r), a.inv_freq, a.attention_factor,
                     false);
  __syncthreads();
  const int32_t* pages = a.b.page_indices + a.b.page_indptr[s];
  const int64_t off = window_row(pages, a.b.block_size, r, a.rows_per_page, w, D);
  for (int d = threadIdx.x; d < D; d += blockDim.x)
    store_elem(a.plane, a.plane_type, off + d, v[d]);
}

constexpr int kHeadsPerBlock = 8;  // query heads sharing a block's key tiles
constexpr int kKeyTile = 8;        // keys a tile
constexpr int kWarps = kThreads / 32;
constexpr int kAccPerHead = kSinkMaxHeadDim / kThreads;

// Block (token, group of kHeadsPerBlock heads): the token's keys (window rows, then entries) in
// tiles through shared memory, scores by warps (lanes over channels), an online softmax per head
// started at the sink (m = sink, l = 1), each thread accumulating its channels of every head.
__global__ void __launch_bounds__(kThreads) sink_attention_kernel(SinkAttentionLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float sm[];
  const int D = a.head_dim, HG = kHeadsPerBlock;
  float* qs = sm;                       // [HG][D]
  float* ks = qs + HG * D;              // [kKeyTile][D + 1]
  float* sc = ks + kKeyTile * (D + 1);  // [HG][kKeyTile]: scores, then probabilities
  float* mh = sc + HG * kKeyTile;       // [HG] running max
  float* lh = mh + HG;                  // [HG] running sum
  float* al = lh + HG;                  // [HG] this tile's rescale
  __shared__ int64_t rowoff[kKeyTile];  // element offset of each key, -1: none
  __shared__ int which[kKeyTile];       // 0: raw plane, 1: entries
  const int t = blockIdx.x, h0 = blockIdx.y * HG;
  const int nh = min(HG, a.heads - h0);
  int s;
  const int p = context_index(a.b, t, &s);
  const int32_t* pages = a.b.page_indices + a.b.page_indptr[s];
  const int lo = max(0, p - a.window + 1), nwin = p - lo + 1;
  const int nent = a.entries ? (a.topk ? a.top_k : (p + 1) / a.ratio) : 0;
  const int total = nwin + nent;
  const char* qrow = row_of(a.q, t);
  for (int i = threadIdx.x; i < HG * D; i += blockDim.x) {
    const int h = i / D;
    qs[i] = h < nh ? load_elem(qrow, a.q.type, static_cast<int64_t>(h0 + h) * D + i % D) : 0.0f;
  }
  if (threadIdx.x < HG) {
    const int h = threadIdx.x;
    mh[h] = h < nh ? a.sinks[h0 + h] : 0.0f;
    lh[h] = 1.0f;
  }
  float acc[HG][kAccPerHead];
#pragma unroll
  for (int h = 0; h < HG; ++h)
#pragma unroll
    for (int c = 0; c < kAccPerHead; ++c) acc[h][c] = 0.0f;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int k0 = 0; k0 < total; k0 += kKeyTile) {
    __syncthreads();  // the previous tile is consumed
    if (threadIdx.x < kKeyTile) {
      const int k = k0 + threadIdx.x;
      int64_t off = -1;
      int src = 0;
      if (k < nwin) {
        const int pos = lo + k;
        off = (static_cast<int64_t>(pages[pos / a.b.block_size]) * a.b.block_size +
               pos % a.b.block_size) *
              D;
      } else if (k < total) {
        const int e = k - nwin;
        const int w = a.topk ? a.topk[static_cast<int64_t>(t) * a.top_k + e] : e;
        if (w >= 0) {
          off = window_row(pages, a.b.block_size, a.ratio, a.entry_rows_per_page, w, D);
          src = 1;
        }
      }
      rowoff[threadIdx.x] = off;
      which[threadIdx.x] = src;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kKeyTile * D; i += blockDim.x) {
      const int k = i / D, d = i % D;
      const int64_t off = rowoff[k];
      ks[k * (D + 1) + d] =
          off < 0 ? 0.0f : load_elem(which[k] ? a.entries : a.raw, a.cache_type, off + d);
    }
    __syncthreads();
    // Scores: warp w takes pairs (head, key) w, w + kWarps, ...
    for (int pr = warp; pr < HG * kKeyTile; pr += kWarps) {
      const int h = pr / kKeyTile, k = pr % kKeyTile;
      float dot = 0.0f;
      for (int d = lane; d < D; d += 32) dot += qs[h * D + d] * ks[k * (D + 1) + d];
      dot = warp_sum(dot);
      if (lane == 0) sc[h * kKeyTile + k] = rowoff[k] < 0 ? -INFINITY : dot * a.scale;
    }
    __syncthreads();
    if (threadIdx.x < HG) {
      const int h = threadIdx.x;
      float mx = mh[h];
      for (int k = 0; k < kKeyTile; ++k) mx = fmaxf(mx, sc[h * kKeyTile + k]);
      const float alpha = expf(mh[h] - mx);
      float sum = 0.0f;
      for (int k = 0; k < kKeyTile; ++k) {
        const float e = expf(sc[h * kKeyTile + k] - mx);  // -inf: 0
        sc[h * kKeyTile + k] = e;
        sum += e;
      }
      lh[h] = lh[h] * alpha + sum;
      mh[h] = mx;
      al[h] = alpha;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < HG; ++h) {
      const float alpha = al[h];
#pragma unroll
      for (int c = 0; c < kAccPerHead; ++c) {
        const int d = threadIdx.x + c * kThreads;
        if (d >= D) break;
        float x = acc[h][c] * alpha;
        for (int k = 0; k < kKeyTile; ++k) x += sc[h * kKeyTile + k] * ks[k * (D + 1) + d];
        acc[h][c] = x;
      }
    }
  }
  __syncthreads();
  char* orow = row_of(a.out, t);
#pragma unroll
  for (int h = 0; h < HG; ++h) {
    if (h >= nh) break;
    const float inv = 1.0f / lh[h];
#pragma unroll
    for (int c = 0; c < kAccPerHead; ++c) {
      const int d = threadIdx.x + c * kThreads;
      if (d >= D) break;
      store_elem(orow, a.out.type, static_cast<int64_t>(h0 + h) * D + d, acc[h][c] * inv);
    }
  }
}

__global__ void gather_table_rows_kernel(int32_t* out, const int32_t* ids, const int32_t* table,
                                         int64_t n, int64_t vocab, int k) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t tok = ids[i / k];
    out[i] = tok >= 0 && tok < vocab ? table[tok * k + i % k] : -1;
  }
}

}  // namespace

void launch_heads_norm_rope(const HeadsRopeLaunch& a, cudaStream_t s) {
  if (a.x.rows == 0) return;
  launch(heads_norm_rope_kernel, static_cast<unsigned>(a.x.rows), kThreads,
         static_cast<size_t>(a.head_dim) * sizeof(float), s, a);
}

void launch_window_pool(const WindowPoolLaunch& a, cudaStream_t s) {
  if (a.num_tokens == 0 || a.b.num_seqs == 0) return;
  launch(window_pool_kernel,
         dim3(static_cast<unsigned>(a.b.num_seqs),
              static_cast<unsigned>((a.head_dim + kThreads - 1) / kThreads)),
         kThreads, 0, s, a);
  launch(window_finish_kernel, static_cast<unsigned>(a.num_tokens), kThreads,
         static_cast<size_t>(a.head_dim) * sizeof(float), s, a);
}

void launch_sink_attention(const SinkAttentionLaunch& a, cudaStream_t s) {
  if (a.num_tokens == 0) return;
  static std::atomic<uint64_t> smem_set{0};
  const int D = a.head_dim;
  const int smem =
      (kHeadsPerBlock * D + kKeyTile * (D + 1) + kHeadsPerBlock * kKeyTile + 3 * kHeadsPerBlock) *
      static_cast<int>(sizeof(float));
  max_dynamic_smem_once(smem_set, sink_attention_kernel, 64 * 1024);
  launch(sink_attention_kernel,
         dim3(static_cast<unsigned>(a.num_tokens),
              static_cast<unsigned>((a.heads + kHeadsPerBlock - 1) / kHeadsPerBlock)),
         kThreads, static_cast<size_t>(smem), s, a);
}

void launch_gather_table_rows(int32_t* out, const int32_t* ids, const int32_t* table,
                              int64_t num_tokens, int64_t vocab, int k, cudaStream_t s) {
  const int64_t n = num_tokens * k;
  if (n == 0) return;
  launch(gather_table_rows_kernel, grid_for(n, 256), 256, 0, s, out, ids, table, n, vocab, k);
}

}  // namespace atom::kernels::cuda
