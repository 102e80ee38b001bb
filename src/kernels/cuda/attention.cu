// Paged flash attention on tensor cores (mma.sync m16n8k16, FlashAttention-2 structure), for
// prefill, chunked prefill and decode alike.
//
// A CTA owns one (sequence, kv head) and BM consecutive "rows": the query rows of that kv head's
// group, packed as row = token * G + head_in_group, so the group's heads share every K/V tile
// (GQA packing; a decode step of G heads fills G rows of one 16-row MMA tile). Each of the 4
// warps owns 16 * MA rows. K/V tiles of 64 keys are gathered from the paged cache with cp.async
// (zero-filled past the context) into a 2-stage ring; shared-memory rows are XOR-swizzled in
// 16-byte chunks so that ldmatrix is conflict-free. Softmax runs online in base 2. With
// num_splits > 1 the key range is split across CTAs (flash-decoding) and partial results are
// merged by attention_combine_kernel.
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/mma.cuh"

namespace atom::kernels::cuda {

namespace {

constexpr int kWarps = 4;
// Keys per K/V tile: 64, or 32 where 64 would not fit the registers (head_dim 128 with two MMA
// atoms per warp: the S tile and O accumulators would need more than 255).
template <int D, int MA>
constexpr int kBlockN = (D == 128 && MA == 2) ? 32 : 64;
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

template <typename T, int D, int MA>
__global__ void __launch_bounds__(kWarps * 32) flash_attention_kernel(AttnLaunch a) {
  constexpr int BM = kWarps * 16 * MA;
  constexpr int kBN = kBlockN<D, MA>;
  constexpr int DC = D / 8;  // 16-byte chunks per row
  constexpr int NT = kBN / 8;
  constexpr int DT = D / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + BM * D;
  T* sV = sK + 2 * kBN * D;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int G = a.num_heads / a.num_kv_heads;
  const int s = blockIdx.y / a.num_kv_heads, kh = blockIdx.y % a.num_kv_heads;
  const int split = blockIdx.z;
  const int q0 = a.query_start[s], qlen = a.query_start[s + 1] - q0;
  const int L = a.context_lens[s];
  const int rows = qlen * G;
  const int m0 = (gridDim.x - 1 - blockIdx.x) * BM;  // the longest (latest) tiles start first
  if (m0 >= rows) return;
  const int i_lo = m0 / G, i_hi = min(qlen - 1, (m0 + BM - 1) / G);
  const int qpos_lo = L - qlen + i_lo, qpos_hi = L - qlen + i_hi;
  const int kv_end = qpos_hi + 1;
  const int kv_begin = (a.window > 0 ? max(0, qpos_lo - a.window + 1) : 0) / kBN * kBN;
  const int n_tiles = (kv_end - kv_begin + kBN - 1) / kBN;
  const int per_split = (n_tiles + a.num_splits - 1) / a.num_splits;
  const int t_begin = split * per_split;
  const int t_end = min(n_tiles, t_begin + per_split);

  // This thread's two rows per MMA atom: lane/4 and lane/4 + 8 of the atom.
  auto local_row = [&](int ma, int h) { return warp * 16 * MA + ma * 16 + (lane >> 2) + h * 8; };
  // token * num_heads + head of packed row pr, or -1 for padding rows.
  auto out_row_of = [&](int pr) -> int64_t {
    return pr < rows ? static_cast<int64_t>(q0 + pr / G) * a.num_heads + kh * G + pr % G : -1;
  };
  int qpos[MA][2];
#pragma unroll
  for (int ma = 0; ma < MA; ++ma)
#pragma unroll
    for (int h = 0; h < 2; ++h) qpos[ma][h] = L - qlen + min((m0 + local_row(ma, h)) / G, qlen - 1);

  if (t_begin >= t_end) {  // an empty split: its partial holds nothing
#pragma unroll
    for (int ma = 0; ma < MA; ++ma)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t orow = out_row_of(m0 + local_row(ma, h));
        if (orow < 0) continue;
        const int64_t pi = static_cast<int64_t>(split) * a.num_tokens * a.num_heads + orow;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          const int col = dt * 8 + 2 * (lane & 3);
          a.part_o[pi * D + col] = 0.0f;
          a.part_o[pi * D + col + 1] = 0.0f;
        }
        if ((lane & 3) == 0) {
          a.part_ml[pi * 2] = -INFINITY;
          a.part_ml[pi * 2 + 1] = 0.0f;
        }
      }
    return;
  }

  const T* qg = static_cast<const T*>(a.q);
  const T* kc = static_cast<const T*>(a.k_cache);
  const T* vc = static_cast<const T*>(a.v_cache);
  for (int idx = tid; idx < BM * DC; idx += kWarps * 32) {
    const int r = idx / DC, c = idx % DC;
    const int pr = m0 + r;
    const bool valid = pr < rows;
    const int i = valid ? pr / G : 0, g = valid ? pr % G : 0;
    const T* src = qg + static_cast<int64_t>(q0 + i) * a.q_stride + static_cast<int64_t>(kh * G + g) * D + c * 8;
    cp_async16(smem_addr(sQ + swz<D>(r, c)), valid ? src : qg, valid);
  }
  const int32_t* pages = a.page_indices + a.page_indptr[s];
  auto load_kv = [&](int tile, int stage) {
    const int n0 = kv_begin + tile * kBN;
    T* dk = sK + stage * kBN * D;
    T* dv = sV + stage * kBN * D;
    for (int idx = tid; idx < kBN * DC; idx += kWarps * 32) {
      const int r = idx / DC, c = idx % DC;
      const int j = n0 + r;
      const bool valid = j < kv_end;
      int64_t off = 0;
      if (valid) {
        const int64_t page = pages[j / a.block_size];
        off = ((page * a.block_size + j % a.block_size) * a.num_kv_heads + kh) * D + c * 8;
      }
      cp_async16(smem_addr(dk + swz<D>(r, c)), kc + off, valid);
      cp_async16(smem_addr(dv + swz<D>(r, c)), vc + off, valid);
    }
  };
  load_kv(t_begin, 0);
  cp_async_commit();

  float o[MA][DT][4];
  float m_run[MA][2], l_run[MA][2];
#pragma unroll
  for (int ma = 0; ma < MA; ++ma) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[ma][dt][e] = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_run[ma][h] = -INFINITY;
      l_run[ma][h] = 0.0f;
    }
  }
  const bool warp_active = m0 + warp * 16 * MA < rows;
  // Per-thread ldmatrix offsets (bytes) at k step 0; see the S = Q Kᵀ loop.
  const uint32_t sQ_addr = smem_addr(sQ), sK_addr = smem_addr(sK), sV_addr = smem_addr(sV);
  const int r7 = lane & 7;
  const uint32_t q_off = (warp * 16 * MA + (lane & 15)) * D * 2 + (((lane >> 4) ^ r7) << 4);
  const uint32_t k_off = ((lane >> 4) * 8 + r7) * D * 2 + ((((lane >> 3) & 1) ^ r7) << 4);
  const uint32_t v_off = (r7 + ((lane >> 3) & 1) * 8) * D * 2 + (((lane >> 4) ^ r7) << 4);
  const float scale_log2 = a.scale * kLog2e;

  for (int t = t_begin; t < t_end; ++t) {
    const int stage = (t - t_begin) & 1;
    if (t + 1 < t_end) {
      load_kv(t + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (warp_active) {
      const int n0 = kv_begin + t * kBN;
      float sc[MA][NT][4];
#pragma unroll
      for (int ma = 0; ma < MA; ++ma)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sc[ma][nt][e] = 0.0f;
      // S = Q Kᵀ. Offsets are in bytes; step kk of 16 columns flips bits 5.. of the swizzled
      // chunk offset (swz: chunk ^ (row & 7) with chunk = 2kk + b equals (b ^ (row & 7)) ^ 2kk).
      const uint32_t ks_addr = sK_addr + stage * (kBN * D * 2);
      const uint32_t vs_addr = sV_addr + stage * (kBN * D * 2);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[MA][4];
#pragma unroll
        for (int ma = 0; ma < MA; ++ma) ldmatrix_x4(sQ_addr + ma * 16 * D * 2 + (q_off ^ (kk << 5)), qa[ma]);
#pragma unroll
        for (int nt2 = 0; nt2 < kBN / 16; ++nt2) {
          uint32_t b[4];
          ldmatrix_x4(ks_addr + nt2 * 16 * D * 2 + (k_off ^ (kk << 5)), b);
#pragma unroll
          for (int ma = 0; ma < MA; ++ma) {
            mma16816<T>(sc[ma][2 * nt2], qa[ma], b[0], b[1]);
            mma16816<T>(sc[ma][2 * nt2 + 1], qa[ma], b[2], b[3]);
          }
        }
      }
      // Scale (log2 units), soft-cap, mask.
      const bool need_mask = n0 + kBN - 1 > qpos_lo || (a.window > 0 && n0 <= qpos_hi - a.window);
#pragma unroll
      for (int ma = 0; ma < MA; ++ma)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float v = sc[ma][nt][e];
            v = a.softcap > 0.0f ? a.softcap * tanhf(v * a.scale / a.softcap) * kLog2e : v * scale_log2;
            if (need_mask) {
              const int key = n0 + nt * 8 + 2 * (lane & 3) + (e & 1);
              const int qp = qpos[ma][e >> 1];
              if (key > qp || (a.window > 0 && key <= qp - a.window)) v = -INFINITY;
            }
            sc[ma][nt][e] = v;
          }
      // Online softmax.
#pragma unroll
      for (int ma = 0; ma < MA; ++ma)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = m_run[ma][h];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(sc[ma][nt][2 * h], sc[ma][nt][2 * h + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_use = mx == -INFINITY ? 0.0f : mx;
          const float alpha = fast_exp2(m_run[ma][h] - m_use);
          m_run[ma][h] = mx;
          float rs = 0.0f;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const float p0 = fast_exp2(sc[ma][nt][2 * h] - m_use);
            const float p1 = fast_exp2(sc[ma][nt][2 * h + 1] - m_use);
            sc[ma][nt][2 * h] = p0;
            sc[ma][nt][2 * h + 1] = p1;
            rs += p0 + p1;
          }
          l_run[ma][h] = l_run[ma][h] * alpha + rs;
#pragma unroll
          for (int dt = 0; dt < DT; ++dt) {
            o[ma][dt][2 * h] *= alpha;
            o[ma][dt][2 * h + 1] *= alpha;
          }
        }
      // O += P V
#pragma unroll
      for (int kc2 = 0; kc2 < kBN / 16; ++kc2) {
        uint32_t pa[MA][4];
#pragma unroll
        for (int ma = 0; ma < MA; ++ma) {
          pa[ma][0] = pack2<T>(sc[ma][2 * kc2][0], sc[ma][2 * kc2][1]);
          pa[ma][1] = pack2<T>(sc[ma][2 * kc2][2], sc[ma][2 * kc2][3]);
          pa[ma][2] = pack2<T>(sc[ma][2 * kc2 + 1][0], sc[ma][2 * kc2 + 1][1]);
          pa[ma][3] = pack2<T>(sc[ma][2 * kc2 + 1][2], sc[ma][2 * kc2 + 1][3]);
        }
#pragma unroll
        for (int dt2 = 0; dt2 < D / 16; ++dt2) {
          uint32_t b[4];
          ldmatrix_x4_trans(vs_addr + kc2 * 16 * D * 2 + (v_off ^ (dt2 << 5)), b);
#pragma unroll
          for (int ma = 0; ma < MA; ++ma) {
            mma16816<T>(o[ma][2 * dt2], pa[ma], b[0], b[1]);
            mma16816<T>(o[ma][2 * dt2 + 1], pa[ma], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // the stage just read is the next prefetch's target
  }

  // Epilogue: rows' sums over the quad, then the normalised output or the split partial.
#pragma unroll
  for (int ma = 0; ma < MA; ++ma)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[ma][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int64_t orow = out_row_of(m0 + local_row(ma, h));
      if (orow < 0) continue;
      if (a.num_splits > 1) {
        const int64_t pi = static_cast<int64_t>(split) * a.num_tokens * a.num_heads + orow;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          const int col = dt * 8 + 2 * (lane & 3);
          *reinterpret_cast<float2*>(a.part_o + pi * D + col) = make_float2(o[ma][dt][2 * h], o[ma][dt][2 * h + 1]);
        }
        if ((lane & 3) == 0) {
          a.part_ml[pi * 2] = m_run[ma][h];
          a.part_ml[pi * 2 + 1] = l;
        }
        continue;
      }
      float oscale = 1.0f;
      if (a.sinks) {
        const int head = static_cast<int>(orow % a.num_heads);
        const float sink = a.sinks[head] * kLog2e;
        const float mf = fmaxf(m_run[ma][h], sink);
        oscale = fast_exp2(m_run[ma][h] - mf);
        l = l * oscale + fast_exp2(sink - mf);
      }
      const float inv = oscale / l;
      const int64_t token = orow / a.num_heads;
      const int head = static_cast<int>(orow % a.num_heads);
      T* dst = static_cast<T*>(a.out) + token * a.out_stride + static_cast<int64_t>(head) * D;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const int col = dt * 8 + 2 * (lane & 3);
        *reinterpret_cast<uint32_t*>(dst + col) = pack2<T>(o[ma][dt][2 * h] * inv, o[ma][dt][2 * h + 1] * inv);
      }
    }
}

// One warp per (token, head): merges the splits' partials, applies sinks, writes the output.
template <typename T>
__global__ void attention_combine_kernel(AttnLaunch a) {
  const int64_t wid = static_cast<int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const int64_t rows = a.num_tokens * a.num_heads;
  if (wid >= rows) return;
  const int D = a.head_dim;
  const int head = static_cast<int>(wid % a.num_heads);
  float mx = -INFINITY;
  for (int sp = 0; sp < a.num_splits; ++sp) mx = fmaxf(mx, a.part_ml[(sp * rows + wid) * 2]);
  const float sink = a.sinks ? a.sinks[head] * kLog2e : -INFINITY;
  mx = fmaxf(mx, sink);
  float denom = a.sinks ? exp2f(sink - mx) : 0.0f;
  for (int sp = 0; sp < a.num_splits; ++sp) {
    const float* ml = a.part_ml + (sp * rows + wid) * 2;
    denom += exp2f(ml[0] - mx) * ml[1];
  }
  const float inv = 1.0f / denom;
  T* dst = static_cast<T*>(a.out) + (wid / a.num_heads) * a.out_stride + static_cast<int64_t>(head) * D;
  for (int d = lane; d < D; d += 32) {
    float acc = 0.0f;
    for (int sp = 0; sp < a.num_splits; ++sp)
      acc += exp2f(a.part_ml[(sp * rows + wid) * 2] - mx) * a.part_o[(sp * rows + wid) * D + d];
    dst[d] = from_float<T>(acc * inv);
  }
}

template <typename T, int D, int MA>
void launch_flash_typed(const AttnLaunch& a, cudaStream_t s) {
  constexpr int BM = kWarps * 16 * MA;
  constexpr int kBN = kBlockN<D, MA>;
  constexpr size_t smem = static_cast<size_t>(BM * D + 4 * kBN * D) * sizeof(T);
  static const bool configured = [] {
    cudaFuncSetAttribute(flash_attention_kernel<T, D, MA>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(smem));
    return true;
  }();
  (void)configured;
  const int G = a.num_heads / a.num_kv_heads;
  const int64_t max_rows = static_cast<int64_t>(a.max_query_len) * G;
  const dim3 grid(static_cast<unsigned>((max_rows + BM - 1) / BM),
                  static_cast<unsigned>(a.num_seqs * a.num_kv_heads), static_cast<unsigned>(a.num_splits));
  flash_attention_kernel<T, D, MA><<<grid, kWarps * 32, smem, s>>>(a);
}

template <typename T>
void launch_flash_dtype(const AttnLaunch& a, int m_atoms, cudaStream_t s) {
  switch (a.head_dim) {
    case 64: m_atoms == 2 ? launch_flash_typed<T, 64, 2>(a, s) : launch_flash_typed<T, 64, 1>(a, s); break;
    case 128: m_atoms == 2 ? launch_flash_typed<T, 128, 2>(a, s) : launch_flash_typed<T, 128, 1>(a, s); break;
    default: launch_flash_typed<T, 256, 1>(a, s); break;
  }
}

}  // namespace

bool flash_attention_supported(const AttnLaunch& a) {
  auto ok16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return (a.type == Elem::kBF16 || a.type == Elem::kF16) &&
         (a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256) && a.q_stride % 8 == 0 &&
         a.out_stride % 2 == 0 && ok16(a.q) && ok16(a.k_cache) && ok16(a.v_cache) &&
         (reinterpret_cast<uintptr_t>(a.out) & 3) == 0;
}

int flash_attention_block_rows(int m_atoms) { return kWarps * 16 * m_atoms; }

void launch_flash_attention(const AttnLaunch& a, int m_atoms, cudaStream_t s) {
  if (a.num_tokens == 0 || a.num_seqs == 0) return;
  if (a.type == Elem::kBF16)
    launch_flash_dtype<__nv_bfloat16>(a, m_atoms, s);
  else
    launch_flash_dtype<__half>(a, m_atoms, s);
}

void launch_attention_combine(const AttnLaunch& a, cudaStream_t s) {
  const int64_t rows = a.num_tokens * a.num_heads;
  if (rows == 0) return;
  const unsigned grid = static_cast<unsigned>((rows + 3) / 4);
  if (a.type == Elem::kBF16)
    attention_combine_kernel<__nv_bfloat16><<<grid, 128, 0, s>>>(a);
  else
    attention_combine_kernel<__half><<<grid, 128, 0, s>>>(a);
}

}  // namespace atom::kernels::cuda
