// Absorbed multi-head latent attention on Hopper's warpgroup MMA: the FlashMLA problem (many
// query heads over one shared latent row per token: keys of L + R = 576 channels, the value the
// first L = 512 of them; or R = 0, GLM-5.3's rows of 512 without rope channels).
//
// A CTA of two warpgroups owns 64 query rows: in dense mode 64 packed (token, head) rows of one
// sequence (row = token * H + head), in sparse mode 64 heads of one token (the token's top-k list
// names its keys). Q [64, 576] stays in shared memory; 64-key tiles of latent rows are gathered
// from the paged cache with cp.async (page lookups per key, zero-filled past the context) into
// two stages, all tiles laid out as wgmma's 128-byte-swizzled canonical K-major tiles
// [576 / 64][rows][64] (row r's 16-byte chunk c at c ^ (r % 8)); the same layout is the value's
// MN-major B operand. Per tile:
//   S_w = Q K[32 w, 32 w + 32)ᵀ  (warpgroup w: m64n32k16, 36 k-steps)
//   row maxima exchanged through shared memory (both warpgroups keep the same running max), P_w
//   = 2^(S_w scale log2e - m) written to shared memory as the A operand of
//   O_w += P V[:, 256 w, 256 w + 256)  (m64n128k16 x 2, A and B in shared memory)
// so each warpgroup holds half of the 64 x 512 FP32 output (128 registers a thread). The next
// tile's copies are in flight while a tile is computed. Long contexts split across CTAs
// (grid z): each split writes normalised partial rows and its (max, sum), merged by
// mla_combine_kernel.
#include <atomic>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/mla_wgmma.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace atom::kernels::cuda {

namespace {

// The rope part kR is a template argument: kMlaFastRope (64, DeepSeek's 576-wide rows) or 0
// (GLM-5.3's NoPE rows of 512).
constexpr int kL = kMlaFastLatent;                     // 512
constexpr int kBM = kMlaFastRows, kBN = kMlaFastKeys;  // 64 rows, 64 keys
constexpr int kThreads = 256;
constexpr int kPBytes = kBM * kBN * 2;  // 8,192
constexpr float kLog2e = 1.4426950408889634f;
// One [W / 64][64][64] tile: 73,728 bytes at W 576 (9 column blocks), 65,536 at 512.
template <int kR>
constexpr int tile_bytes() {
  return (kL + kR) / 64 * 64 * 128;
}
template <int kR>
constexpr size_t smem_bytes() {
  return 3 * tile_bytes<kR>() + kPBytes + 3 * 2 * 64 * 4 + 1024;
}

__device__ __forceinline__ uint32_t tile_chunk(int row, int c) {
  return static_cast<uint32_t>((c >> 3) * (64 * 128) + row * 128 + (((c & 7) ^ (row & 7)) << 4));
}

// kOverlap: the loop issues tile t's P V and goes on to tile t + 1's Q Kᵀ without waiting
// (they run back to back on the tensor cores); tile t + 1's copies are issued once both
// warpgroups' P V of tile t - 1 has retired (after the row-max exchange), one barrier fewer per
// tile. Else: the next tile's copies at the top of the loop, each P V waited at its end.
template <typename T, bool kOverlap, int kR>
__global__ void __launch_bounds__(kThreads, 1) mla_fast_kernel(MlaLaunch a) {
  constexpr int kW = kL + kR;                   // 576 or 512
  constexpr int kChunks = kW / 8;               // 16-byte chunks a row: 72 or 64
  constexpr int kTileBytes = tile_bytes<kR>();  // [kW / 64][64][64]
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  unsigned char* sQ = base;
  unsigned char* sK = base + kTileBytes;  // two stages
  unsigned char* sP = base + 3 * kTileBytes;
  float* red_m = reinterpret_cast<float*>(sP + kPBytes);  // [2][64]
  float* red_l = red_m + 128;                             // [2][64]
  int* kvalid = reinterpret_cast<int*>(red_l + 128);      // [2 stages][64]

  const int tid = threadIdx.x, wg = tid >> 7, wi = (tid >> 5) & 3, lane = tid & 31;
  const int H = a.num_heads;
  const bool sparse = a.topk != nullptr;
  // This CTA's rows and keys.
  int s, q0, ql, row0, nrows, nkeys;
  int64_t token_sparse = 0;
  if (!sparse) {
    s = blockIdx.y;
    q0 = a.query_start[s];
    ql = a.query_start[s + 1] - q0;
    row0 = blockIdx.x * kBM;  // packed rows [row0, row0 + nrows) of the sequence
    nrows = min(kBM, ql * H - row0);
    if (nrows <= 0) return;
    nkeys = a.context_lens[s] - ql + (row0 + nrows - 1) / H + 1;
  } else {
    token_sparse = blockIdx.y;
    int lo = 0, hi = a.num_seqs - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (a.query_start[mid] <= token_sparse)
        lo = mid;
      else
        hi = mid - 1;
    }
    s = lo;
    q0 = a.query_start[s];
    ql = a.query_start[s + 1] - q0;
    row0 = blockIdx.x * kBM;  // heads [row0, row0 + nrows) of the token
    nrows = min(kBM, H - row0);
    nkeys = a.top_k;
  }
  const int n_ctx = a.context_lens[s];
  const int32_t* pages = a.page_indices + a.page_indptr[s];
  const int tiles = (nkeys + kBN - 1) / kBN;
  const int per_split = (tiles + a.num_splits - 1) / a.num_splits;
  const int tb = blockIdx.z * per_split, te = min(tiles, tb + per_split);

  // The query position of packed row r (its causal bound), and its (token, head).
  auto row_token = [&](int r) -> int64_t {
    return sparse ? token_sparse : static_cast<int64_t>(q0) + (row0 + r) / H;
  };
  auto row_head = [&](int r) { return sparse ? row0 + r : (row0 + r) % H; };
  auto row_qpos = [&](int r) {
    const int i = sparse ? static_cast<int>(token_sparse) - q0 : (row0 + min(r, nrows - 1)) / H;
    return n_ctx - ql + i;
  };
  const T* cache = static_cast<const T*>(a.cache);
  const int qpos_sparse = sparse ? row_qpos(0) : 0;

  auto load_q = [&] {
    const uint32_t q_addr = smem_addr(sQ);
    for (int e = tid; e < kBM * kChunks; e += kThreads) {
      const int r = e / kChunks, c = e % kChunks;
      const bool ok = r < nrows;
      const T* src =
          static_cast<const T*>(a.q) +
          (ok ? row_token(r) * a.q_stride + static_cast<int64_t>(row_head(r)) * kW + c * 8 : 0);
      cp_async16(q_addr + tile_chunk(r, c), src, ok);
    }
  };
  // Tile `it`'s 64 keys: four threads a key, 18 chunks each.
  auto load_k = [&](int it, int st) {
    const int r = tid >> 2, part = tid & 3;
    const int k = it * kBN + r;
    int j = -1;
    if (k < nkeys) {
      if (sparse) {
        j = a.topk[token_sparse * a.top_k + k];
        if (j > qpos_sparse) j = -1;
      } else {
        j = k;
      }
    }
    const bool ok = j >= 0;
    if (part == 0) kvalid[st * 64 + r] = ok;
    const T* src =
        cache +
        (ok ? (static_cast<int64_t>(pages[j / a.block_size]) * a.block_size + j % a.block_size) * kW
            : 0);
    const uint32_t k_addr = smem_addr(sK + st * kTileBytes);
#pragma unroll
    for (int i = 0; i < kChunks / 4; ++i) {
      const int c = part * (kChunks / 4) + i;
      cp_async16(k_addr + tile_chunk(r, c), src + c * 8, ok);
    }
  };

  const int r_lo = 16 * wi + (lane >> 2);  // this thread's rows: r_lo and r_lo + 8
  int qp[2];
  qp[0] = row_qpos(r_lo);
  qp[1] = row_qpos(r_lo + 8);
  float o[2][64];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 64; ++i) o[h][i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const float scale_log2 = a.scale * kLog2e;
  const uint32_t sQ_addr = smem_addr(sQ), sK_addr = smem_addr(sK), sP_addr = smem_addr(sP);

  if (tb < te) {
    load_q();
    load_k(tb, 0);
  }
  cp_async_commit();
  float sc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) sc[i] = 0.0f;
  for (int it = tb; it < te; ++it) {
    const int st = (it - tb) & 1;
    if constexpr (!kOverlap) {
      if (it + 1 < te) load_k(it + 1, st ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();  // tile it (issued during the previous tile's softmax)
    }
    fence_proxy_async();
    __syncthreads();
    const uint32_t k_addr = sK_addr + st * kTileBytes;
    // sc is not cleared here (its first k-step ignores it): no other instruction may define a
    // wgmma's accumulators while the previous P V is in flight, or ptxas serializes the wgmmas.
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kW / 16; ++kk) {
      const uint32_t qa = sQ_addr + (kk >> 2) * (64 * 128) + (kk & 3) * 32;
      const uint32_t kb = k_addr + (kk >> 2) * (64 * 128) + (32 * wg) * 128 + (kk & 3) * 32;
      wgmma_m64n32k16_ss<T>(sc, wgmma_desc(qa, 16, 1024), wgmma_desc(kb, 16, 1024), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();  // kOverlap: also the previous tile's P V (committed before)
    // Mask, scale to log2 units, the row maxima of this warpgroup's 32 keys.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = 32 * wg + nt * 8 + 2 * (lane & 3) + (e & 1);
        const int h = e >> 1;
        const bool ok = kvalid[st * 64 + key] && (sparse || it * kBN + key <= qp[h]);
        const float v = ok ? sc[nt * 4 + e] * scale_log2 : -INFINITY;
        sc[nt * 4 + e] = v;
        mx[h] = fmaxf(mx[h], v);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    }
    if ((lane & 3) == 0) {
      red_m[wg * 64 + r_lo] = mx[0];
      red_m[wg * 64 + r_lo + 8] = mx[1];
    }
    __syncthreads();  // kOverlap: both warpgroups' previous P V retired: P and stage st ^ 1 free
    if constexpr (kOverlap) {
      if (it + 1 < te) load_k(it + 1, st ^ 1);
      cp_async_commit();
    }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float other = red_m[(wg ^ 1) * 64 + r_lo + 8 * h];
      const float m_new = fmaxf(m_run[h], fmaxf(mx[h], other));
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      alpha[h] = fast_exp2(m_run[h] - m_use);
      m_run[h] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = fast_exp2(sc[nt * 4 + 2 * h + e] - m_use);
          sc[nt * 4 + 2 * h + e] = p;
          sum += p;
        }
      l_run[h] = l_run[h] * alpha[h] + sum;
    }
    // P (rounded to T) into the [64 rows][64 keys] swizzled tile.
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = r_lo + 8 * h, key = 32 * wg + nt * 8 + 2 * (lane & 3);
        const uint32_t off = row * 128 + ((((key >> 3) ^ (row & 7))) << 4) + (key & 7) * 2;
        *reinterpret_cast<uint32_t*>(sP + off) =
            pack2<T>(sc[nt * 4 + 2 * h], sc[nt * 4 + 2 * h + 1]);
      }
#pragma unroll
    for (int nh = 0; nh < 2; ++nh)
#pragma unroll
      for (int i = 0; i < 64; ++i) o[nh][i] *= alpha[(i >> 1) & 1];
    fence_proxy_async();
    __syncthreads();
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < kBN / 16; ++kc) {
      const uint64_t pa = wgmma_desc(sP_addr + kc * 32, 16, 1024);
#pragma unroll
      for (int nh = 0; nh < 2; ++nh) {
        const uint32_t vb = k_addr + (4 * wg + 2 * nh) * (64 * 128) + kc * 16 * 128;
        wgmma_m64n128k16_ss_tb<T>(o[nh], pa, wgmma_desc(vb, 64 * 128, 1024), 1);
      }
    }
    wgmma_commit();
    if constexpr (!kOverlap) {
      wgmma_wait<0>();
      __syncthreads();  // the stage and P are free for the next tile
    }
  }
  wgmma_wait<0>();
  cp_async_wait<0>();

  // Row sums: the four lanes of a row, then the two warpgroups.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
  if ((lane & 3) == 0) {
    red_l[wg * 64 + r_lo] = l_run[0];
    red_l[wg * 64 + r_lo + 8] = l_run[1];
  }
  __syncthreads();
  const int64_t TH = a.num_tokens * H;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r_lo + 8 * h;
    if (r >= nrows) continue;
    const float l = red_l[r] + red_l[64 + r];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int64_t token = row_token(r);
    const int head = row_head(r);
    if (a.num_splits == 1) {
      T* orow = static_cast<T*>(a.out) + token * a.out_stride + static_cast<int64_t>(head) * kL;
#pragma unroll
      for (int nh = 0; nh < 2; ++nh)
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
          const int col = 256 * wg + 128 * nh + nt * 8 + 2 * (lane & 3);
          *reinterpret_cast<uint32_t*>(orow + col) =
              pack2<T>(o[nh][nt * 4 + 2 * h] * inv, o[nh][nt * 4 + 2 * h + 1] * inv);
        }
    } else {
      const int64_t prow = blockIdx.z * TH + token * H + head;
      float* po = a.part_o + prow * kL;
#pragma unroll
      for (int nh = 0; nh < 2; ++nh)
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
          const int col = 256 * wg + 128 * nh + nt * 8 + 2 * (lane & 3);
          *reinterpret_cast<float2*>(po + col) =
              make_float2(o[nh][nt * 4 + 2 * h] * inv, o[nh][nt * 4 + 2 * h + 1] * inv);
        }
      if (wg == 0 && (lane & 3) == 0) {
        a.part_ml[prow * 2] = l > 0.0f ? m_run[h] : -INFINITY;
        a.part_ml[prow * 2 + 1] = l;
      }
    }
  }
}

// One block per (token, head) row: out = sum_z w_z o_z / sum_z w_z, w_z = l_z 2^(m_z - max m).
template <typename T>
__global__ void __launch_bounds__(128) mla_combine_kernel(MlaLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t row = blockIdx.x, TH = a.num_tokens * a.num_heads;
  float mx = -INFINITY;
  for (int z = 0; z < a.num_splits; ++z) mx = fmaxf(mx, a.part_ml[(z * TH + row) * 2]);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, denom = 0.0f;
  const int col = threadIdx.x * 4;
  for (int z = 0; z < a.num_splits; ++z) {
    const float m = a.part_ml[(z * TH + row) * 2], l = a.part_ml[(z * TH + row) * 2 + 1];
    if (m == -INFINITY) continue;
    const float w = l * exp2f(m - mx);
    const float4 v = *reinterpret_cast<const float4*>(a.part_o + (z * TH + row) * kL + col);
    acc[0] += w * v.x;
    acc[1] += w * v.y;
    acc[2] += w * v.z;
    acc[3] += w * v.w;
    denom += w;
  }
  const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
  const int64_t token = row / a.num_heads;
  const int head = static_cast<int>(row % a.num_heads);
  T* orow = static_cast<T*>(a.out) + token * a.out_stride + static_cast<int64_t>(head) * kL + col;
  *reinterpret_cast<uint2*>(orow) =
      make_uint2(pack2<T>(acc[0] * inv, acc[1] * inv), pack2<T>(acc[2] * inv, acc[3] * inv));
}

std::atomic<uint64_t> g_smem[8];

template <typename T, bool kOverlap, int kR>
void launch_typed(const MlaLaunch& a, std::atomic<uint64_t>& done, cudaStream_t s) {
  constexpr size_t kSmemBytes = smem_bytes<kR>();
  max_dynamic_smem_once(done, mla_fast_kernel<T, kOverlap, kR>, static_cast<int>(kSmemBytes));
  const bool sparse = a.topk != nullptr;
  const unsigned mt =
      sparse ? (a.num_heads + kBM - 1) / kBM
             : static_cast<unsigned>(
                   (static_cast<int64_t>(a.max_query_len) * a.num_heads + kBM - 1) / kBM);
  const unsigned y = sparse ? static_cast<unsigned>(a.num_tokens) : a.num_seqs;
  launch(mla_fast_kernel<T, kOverlap, kR>, dim3(mt, y, a.num_splits), kThreads, kSmemBytes, s, a);
  if (a.num_splits > 1)
    launch(mla_combine_kernel<T>, static_cast<unsigned>(a.num_tokens * a.num_heads), 128, 0, s, a);
}

}  // namespace

bool mla_fast_supported(const MlaLaunch& a) {
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return (a.type == Elem::kBF16 || a.type == Elem::kF16) && a.cache_type == a.type &&
         a.latent_dim == kL && (a.rope_dim == kMlaFastRope || a.rope_dim == 0) &&
         a.q_stride % 8 == 0 && a.out_stride % 8 == 0 && aligned(a.q) && aligned(a.out) &&
         aligned(a.cache);
}

int64_t mla_fast_ctas(const MlaLaunch& a) {
  if (a.topk) return static_cast<int64_t>((a.num_heads + kBM - 1) / kBM) * a.num_tokens;
  return (static_cast<int64_t>(a.max_query_len) * a.num_heads + kBM - 1) / kBM * a.num_seqs;
}

void launch_mla_attention_fast(const MlaLaunch& a, cudaStream_t s) {
  if (a.num_tokens == 0) return;
  const bool bf16 = a.type == Elem::kBF16;
  if (a.rope_dim == 0) {  // NoPE rows (GLM-5.3)
    if (a.pipeline == 1)
      bf16 ? launch_typed<__nv_bfloat16, true, 0>(a, g_smem[4], s)
           : launch_typed<__half, true, 0>(a, g_smem[5], s);
    else
      bf16 ? launch_typed<__nv_bfloat16, false, 0>(a, g_smem[6], s)
           : launch_typed<__half, false, 0>(a, g_smem[7], s);
  } else if (a.pipeline == 1) {
    bf16 ? launch_typed<__nv_bfloat16, true, kMlaFastRope>(a, g_smem[0], s)
         : launch_typed<__half, true, kMlaFastRope>(a, g_smem[1], s);
  } else {
    bf16 ? launch_typed<__nv_bfloat16, false, kMlaFastRope>(a, g_smem[2], s)
         : launch_typed<__half, false, kMlaFastRope>(a, g_smem[3], s);
  }
}

}  // namespace atom::kernels::cuda
