// Paged flash attention on tensor cores (mma.sync m16n8k16, FlashAttention-2 structure).
//
// A CTA owns one (sequence, kv head) and a block of "rows": the query rows of that kv head's
// group, packed as row = token * G + head_in_group, so the group's heads share every K/V tile
// (GQA packing). K/V tiles are gathered from the paged cache with cp.async (zero-filled past the
// context) into a ring of shared-memory stages whose rows are XOR-swizzled in 16-byte chunks, so
// ldmatrix is conflict-free. Softmax runs online in base 2.
//
// Prefill mode: each of the 4 warps owns 16 * MA rows and all keys of a tile.
// Decode mode (a sequence's rows fit one 16-row MMA tile): the 4 warps share the 16 rows and each
// takes 16 keys of every 64-key tile, three stages deep; their partial softmax states are merged
// through shared memory at the end. Long contexts are split across CTAs (flash-decoding); a
// sequence short enough for one split is written directly, else attention_combine_kernel merges.
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/mma.cuh"

namespace atom::kernels::cuda {

namespace {

constexpr int kWarps = 4;

template <int D, int MA, bool kDecode>
struct FlashConfig {
  static constexpr int BM = kDecode ? 16 : kWarps * 16 * MA;  // rows per CTA
  // Keys per tile: 32 where 64 would not fit the registers (head_dim 128, two atoms per warp).
  static constexpr int BN = kDecode ? kDecodeBlockN : (D == 128 && MA == 2 ? 32 : 64);
  static constexpr int kStages = kDecode ? 3 : 2;
  static constexpr int kWarpKeys = kDecode ? 16 : BN;  // keys of a tile one warp handles
  static constexpr size_t kSmem = static_cast<size_t>(BM * D + 2 * kStages * BN * D) * 2;
};

template <typename T, int D, int MA, bool kDecode>
__global__ void __launch_bounds__(kWarps * 32) flash_attention_kernel(AttnLaunch a) {
  // The batch's layout (query starts, context lengths, page tables) was copied in before the
  // step's first kernel, so it is read before waiting on the previous kernel (which writes q and
  // this step's keys); a CTA with nothing to do still waits, keeping completion in order.
  pdl_launch_dependents();
  using C = FlashConfig<D, MA, kDecode>;
  constexpr int BM = C::BM, BN = C::BN, S = C::kStages;
  constexpr int DC = D / 8;             // 16-byte chunks per row
  constexpr int NT = C::kWarpKeys / 8;  // 8-key MMA tiles per warp per tile
  constexpr int DT = D / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + BM * D;
  T* sV = sK + S * BN * D;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const CtaRange r =
      cta_range(a, kDecode ? 0 : gridDim.x - 1 - blockIdx.x, BM, BN);  // long tiles first
  if (r.m0 >= r.rows) return pdl_wait();
  const int split = blockIdx.z;
  int splits = 1, t_begin = 0, t_end = r.n_tiles;
  if constexpr (kDecode) {
    splits = decode_splits(r.n_tiles, a.num_splits, a.split_min_tiles);
    if (split >= splits) return pdl_wait();
    const int per = (r.n_tiles + splits - 1) / splits;
    t_begin = split * per;
    t_end = min(r.n_tiles, t_begin + per);
  }

  // This thread's rows: lane/4 and lane/4 + 8 of each of its MMA atoms.
  const int row_base = kDecode ? 0 : warp * 16 * MA;
  auto local_row = [&](int ma, int h) { return row_base + ma * 16 + (lane >> 2) + h * 8; };
  auto out_row_of = [&](int pr) -> int64_t {  // token * num_heads + head, or -1 for padding
    return pr < r.rows ? static_cast<int64_t>(r.q0 + pr / r.G) * a.num_heads + r.kh * r.G + pr % r.G
                       : -1;
  };
  int qpos[MA][2];
#pragma unroll
  for (int ma = 0; ma < MA; ++ma)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      qpos[ma][h] = a.window < 0 ? r.L - 1  // non-causal
                                 : r.L - r.qlen + min((r.m0 + local_row(ma, h)) / r.G, r.qlen - 1);

  const T* qg = static_cast<const T*>(a.q);
  const T* kc = static_cast<const T*>(a.k_cache);
  const T* vc = static_cast<const T*>(a.v_cache);
  const int32_t* pages = a.page_indices + a.page_indptr[r.s];
  // Decode's K/V tile copies: chunk tid + i * threads of a tile's rows, i < kLoadIters, the pages
  // looked up kGroup at a time before the copies are issued (copy_tile_batched), the first tile's
  // before the PDL wait (the page table is ready before the step). Prefill, at its register limit
  // (batched lookups spilled) and compute-bound, keeps the lookups in the copy loop.
  constexpr int kLoadIters = BN * DC / (kWarps * 32);
  static_assert(BN * DC % (kWarps * 32) == 0, "whole copy passes");
  constexpr int kGroup = kLoadIters < 8 ? kLoadIters : 8;
  constexpr bool kEarlySlots = kDecode && kLoadIters == kGroup;
  auto key_slot = [&](int n0, int i) {  // n0: the tile's first key
    return tile_chunk_slot<DC>(a, pages, n0, r.kv_end, tid + i * kWarps * 32);
  };
  auto copy_chunk = [&](T* dk, T* dv, int i, int slot) {
    const int idx = tid + i * kWarps * 32, row = idx / DC, c = idx % DC;
    const bool valid = slot >= 0;
    const int64_t off =
        valid ? (static_cast<int64_t>(slot) * a.num_kv_heads + r.kh) * D + c * 8 : 0;
    const int sw = row * D + ((c ^ (row & 7)) << 3);
    cp_async16(smem_addr(dk + sw), kc + off, valid);
    cp_async16(smem_addr(dv + sw), vc + off, valid);
  };
  int first_slots[kEarlySlots ? kGroup : 1];
  if constexpr (kEarlySlots) {
    if (t_begin < t_end)
#pragma unroll
      for (int i = 0; i < kGroup; ++i) first_slots[i] = key_slot(r.kv_begin + t_begin * BN, i);
  }
  pdl_wait();
  for (int idx = tid; idx < BM * DC; idx += kWarps * 32) {
    const int row = idx / DC, c = idx % DC;
    const T* src = q_chunk<D>(a, r, qg, row, c);
    cp_async16(smem_addr(sQ + row * D + ((c ^ (row & 7)) << 3)), src ? src : qg, src != nullptr);
  }
  auto load_kv = [&](int tile, int stage) {
    const int n0 = r.kv_begin + tile * BN;
    T* dk = sK + stage * BN * D;
    T* dv = sV + stage * BN * D;
    if constexpr (kDecode) {
      copy_tile_batched<kLoadIters, kGroup>([&](int i) { return key_slot(n0, i); },
                                            [&](int i, int slot) { copy_chunk(dk, dv, i, slot); });
    } else {
      for (int idx = tid; idx < BN * DC; idx += kWarps * 32) {
        const int row = idx / DC, c = idx % DC;
        const int j = n0 + row;
        const bool valid = j < r.kv_end;
        const int64_t off = valid ? kv_row_offset(a, pages, j, r.kh) + c * 8 : 0;
        const int sw = row * D + ((c ^ (row & 7)) << 3);
        cp_async16(smem_addr(dk + sw), kc + off, valid);
        cp_async16(smem_addr(dv + sw), vc + off, valid);
      }
    }
  };
  // Stages ahead: one commit group per tile (empty groups past the end keep the count uniform).
#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    if (t_begin + i < t_end) {
      if (kEarlySlots && i == 0) {
#pragma unroll
        for (int c = 0; c < kGroup; ++c) copy_chunk(sK, sV, c, first_slots[kEarlySlots ? c : 0]);
      } else {
        load_kv(t_begin + i, i);
      }
    }
    cp_async_commit();
  }

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
  const bool warp_active = kDecode || r.m0 + warp * 16 * MA < r.rows;
  const int key_base = kDecode ? warp * 16 : 0;  // this warp's keys within a tile
  // Per-thread ldmatrix byte offsets at k step 0. A step of 16 columns flips bits 5.. of the
  // swizzled chunk: chunk ^ (row & 7) with chunk = 2 kk + b equals (b ^ (row & 7)) ^ 2 kk.
  const uint32_t sQ_addr = smem_addr(sQ), sK_addr = smem_addr(sK), sV_addr = smem_addr(sV);
  const int r7 = lane & 7;
  const uint32_t q_off = (row_base + (lane & 15)) * D * 2 + (((lane >> 4) ^ r7) << 4);
  const uint32_t k_off =
      (key_base + (lane >> 4) * 8 + r7) * D * 2 + ((((lane >> 3) & 1) ^ r7) << 4);
  const uint32_t v_off =
      (key_base + r7 + ((lane >> 3) & 1) * 8) * D * 2 + (((lane >> 4) ^ r7) << 4);
  const float scale_log2 = a.scale * kLog2e;

  for (int t = t_begin; t < t_end; ++t) {
    const int stage = (t - t_begin) % S;
    const int ahead = t + S - 1;
    if (ahead < t_end) load_kv(ahead, (ahead - t_begin) % S);
    cp_async_commit();
    cp_async_wait<S - 1>();
    __syncthreads();
    if (warp_active) {
      const int n0 = r.kv_begin + t * BN + key_base;
      float sc[MA][NT][4];
#pragma unroll
      for (int ma = 0; ma < MA; ++ma)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sc[ma][nt][e] = 0.0f;
      const uint32_t ks_addr = sK_addr + stage * (BN * D * 2);
      const uint32_t vs_addr = sV_addr + stage * (BN * D * 2);
      // S = Q Kᵀ
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[MA][4];
#pragma unroll
        for (int ma = 0; ma < MA; ++ma)
          ldmatrix_x4(sQ_addr + ma * 16 * D * 2 + (q_off ^ (kk << 5)), qa[ma]);
#pragma unroll
        for (int nt2 = 0; nt2 < NT / 2; ++nt2) {
          uint32_t b[4];
          ldmatrix_x4(ks_addr + nt2 * 16 * D * 2 + (k_off ^ (kk << 5)), b);
#pragma unroll
          for (int ma = 0; ma < MA; ++ma) {
            mma16816<T>(sc[ma][2 * nt2], qa[ma], b[0], b[1]);
            mma16816<T>(sc[ma][2 * nt2 + 1], qa[ma], b[2], b[3]);
          }
        }
      }
      // Scale to log2 units (soft-cap first when set), then mask.
      if (a.softcap > 0.0f) {
#pragma unroll
        for (int ma = 0; ma < MA; ++ma)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              sc[ma][nt][e] = a.softcap * tanhf(sc[ma][nt][e] * a.scale / a.softcap) * kLog2e;
      } else {
#pragma unroll
        for (int ma = 0; ma < MA; ++ma)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) sc[ma][nt][e] *= scale_log2;
      }
      if (n0 + C::kWarpKeys - 1 > r.qpos_lo || (a.window > 0 && n0 <= r.qpos_hi - a.window)) {
#pragma unroll
        for (int ma = 0; ma < MA; ++ma)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = n0 + nt * 8 + 2 * (lane & 3) + (e & 1);
              const int qp = qpos[ma][e >> 1];
              if (key > qp || (a.window > 0 && key <= qp - a.window)) sc[ma][nt][e] = -INFINITY;
            }
      }
      // Online softmax.
#pragma unroll
      for (int ma = 0; ma < MA; ++ma)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = m_run[ma][h];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
            mx = fmaxf(mx, fmaxf(sc[ma][nt][2 * h], sc[ma][nt][2 * h + 1]));
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
      for (int kc2 = 0; kc2 < NT / 2; ++kc2) {
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
    __syncthreads();  // the stage just read is a later prefetch's target
  }
  cp_async_wait<0>();

  // Row sums over the quad.
#pragma unroll
  for (int ma = 0; ma < MA; ++ma)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_run[ma][h] += __shfl_xor_sync(0xffffffffu, l_run[ma][h], 1);
      l_run[ma][h] += __shfl_xor_sync(0xffffffffu, l_run[ma][h], 2);
    }

  // Writes row `orow`'s result: normalised output (sinks applied) or, with several splits, the
  // unnormalised partial with its running max and sum.
  auto write_row = [&](int64_t orow, float m, float l, int col, float v0, float v1, bool write_ml) {
    write_attention_row<D>(a, split, splits, orow, m, l, col, v0, v1, write_ml,
                           [&](int64_t r, int head, int c, float x0, float x1) {
                             T* dst = static_cast<T*>(a.out) + (r / a.num_heads) * a.out_stride +
                                      static_cast<int64_t>(head) * D;
                             *reinterpret_cast<uint32_t*>(dst + c) = pack2<T>(x0, x1);
                           });
  };

  if constexpr (!kDecode) {
#pragma unroll
    for (int ma = 0; ma < MA; ++ma)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t orow = out_row_of(r.m0 + local_row(ma, h));
        if (orow < 0) continue;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
          write_row(orow, m_run[ma][h], l_run[ma][h], dt * 8 + 2 * (lane & 3), o[ma][dt][2 * h],
                    o[ma][dt][2 * h + 1], dt == 0 && (lane & 3) == 0);
      }
  } else {
    // Merge the four warps' states of the same 16 rows through shared memory (the K/V stages,
    // free now: every warp passed the loop's last barrier).
    merge_decode_warps<D, kWarps>(
        reinterpret_cast<float*>(sK), tid, [&](int dt, int e) { return o[0][dt][e]; },
        [&](int h) { return m_run[0][h]; }, [&](int h) { return l_run[0][h]; },
        [&](int row) { return out_row_of(r.m0 + row); }, [](int col) { return col; }, 1,
        [&](int64_t orow, float m, float l, int col, float v0, float v1) {
          write_row(orow, m, l, col, v0, v1, col == 0);
        });
    if (splits > 1 && a.counters != nullptr)
      merge_splits_if_last<D, kWarps * 32>(
          a, splits, r.m0, tid, out_row_of, [&](int64_t orow, int head, int col, float v) {
            T* dst = static_cast<T*>(a.out) + (orow / a.num_heads) * a.out_stride +
                     static_cast<int64_t>(head) * D;
            dst[col] = from_float<T>(v);
          });
  }
}

// One warp per (token, head) of a sequence whose context was split: merges the partials of the
// splits it used (decode_splits, as the flash kernel chose), applies sinks, writes the output.
template <typename T>
__global__ void attention_combine_kernel(AttnLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t wid = static_cast<int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const int64_t rows = a.num_tokens * a.num_heads;
  if (wid >= rows) return;
  const int64_t t = wid / a.num_heads;
  int lo = 0, hi = a.num_seqs - 1;  // the last sequence whose first token is <= t
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.query_start[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int qlen = a.query_start[lo + 1] - a.query_start[lo], L = a.context_lens[lo];
  const int qpos_lo = L - qlen;
  const int kv_begin =
      (a.window > 0 ? max(0, qpos_lo - a.window + 1) : 0) / kDecodeBlockN * kDecodeBlockN;
  const int n_tiles = (L - kv_begin + kDecodeBlockN - 1) / kDecodeBlockN;
  const int splits = decode_splits(n_tiles, a.num_splits, a.split_min_tiles);
  if (splits <= 1) return;  // written by the flash kernel
  const int D = a.head_dim;
  const int head = static_cast<int>(wid % a.num_heads);
  float mx = -INFINITY;
  for (int sp = 0; sp < splits; ++sp) mx = fmaxf(mx, a.part_ml[(sp * rows + wid) * 2]);
  const float sink = a.sinks ? a.sinks[head] * kLog2e : -INFINITY;
  mx = fmaxf(mx, sink);
  float denom = a.sinks ? exp2f(sink - mx) : 0.0f;
  for (int sp = 0; sp < splits; ++sp) {
    const float* ml = a.part_ml + (sp * rows + wid) * 2;
    denom += exp2f(ml[0] - mx) * ml[1];
  }
  const float inv = 1.0f / denom;
  T* dst = static_cast<T*>(a.out) + t * a.out_stride + static_cast<int64_t>(head) * D;
  for (int d = lane; d < D; d += 32) {
    float acc = 0.0f;
    for (int sp = 0; sp < splits; ++sp)
      acc += exp2f(a.part_ml[(sp * rows + wid) * 2] - mx) * a.part_o[(sp * rows + wid) * D + d];
    dst[d] = from_float<T>(acc * inv);
  }
}

template <typename T, int D, int MA, bool kDecode>
void launch_flash_typed(const AttnLaunch& a, cudaStream_t s) {
  using C = FlashConfig<D, MA, kDecode>;
  static std::atomic<uint64_t> configured{0};
  max_dynamic_smem_once(configured, flash_attention_kernel<T, D, MA, kDecode>,
                        static_cast<int>(C::kSmem));
  const int G = a.num_heads / a.num_kv_heads;
  const int64_t max_rows = static_cast<int64_t>(a.max_query_len) * G;
  const dim3 grid(kDecode ? 1u : static_cast<unsigned>((max_rows + C::BM - 1) / C::BM),
                  static_cast<unsigned>(a.num_seqs * a.num_kv_heads),
                  kDecode ? static_cast<unsigned>(a.num_splits) : 1u);
  launch(flash_attention_kernel<T, D, MA, kDecode>, grid, kWarps * 32, C::kSmem, s, a);
}

template <typename T>
void launch_flash_dtype(const AttnLaunch& a, int m_atoms, cudaStream_t s) {
  switch (a.head_dim) {
    case 64:
      m_atoms == 2 ? launch_flash_typed<T, 64, 2, false>(a, s)
                   : launch_flash_typed<T, 64, 1, false>(a, s);
      break;
    case 128:
      m_atoms == 2 ? launch_flash_typed<T, 128, 2, false>(a, s)
                   : launch_flash_typed<T, 128, 1, false>(a, s);
      break;
    default:
      launch_flash_typed<T, 256, 1, false>(a, s);
      break;
  }
}

template <typename T>
void launch_decode_dtype(const AttnLaunch& a, cudaStream_t s) {
  switch (a.head_dim) {
    case 64:
      launch_flash_typed<T, 64, 1, true>(a, s);
      break;
    case 128:
      launch_flash_typed<T, 128, 1, true>(a, s);
      break;
    default:
      launch_flash_typed<T, 256, 1, true>(a, s);
      break;
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

void launch_flash_decode(const AttnLaunch& a, cudaStream_t s) {
  if (a.num_tokens == 0 || a.num_seqs == 0) return;
  if (a.type == Elem::kBF16)
    launch_decode_dtype<__nv_bfloat16>(a, s);
  else
    launch_decode_dtype<__half>(a, s);
}

void launch_attention_combine(const AttnLaunch& a, cudaStream_t s) {
  const int64_t rows = a.num_tokens * a.num_heads;
  if (rows == 0) return;
  const unsigned grid = static_cast<unsigned>((rows + 3) / 4);
  if (a.type == Elem::kBF16)
    launch(attention_combine_kernel<__nv_bfloat16>, grid, 128, 0, s, a);
  else
    launch(attention_combine_kernel<__half>, grid, 128, 0, s, a);
}

}  // namespace atom::kernels::cuda
