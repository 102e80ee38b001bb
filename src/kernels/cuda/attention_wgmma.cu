// Prefill attention on Hopper's warpgroup MMA (wgmma). A CTA of NWG warpgroups owns 64 * NWG
// packed query rows (row = token * G + head_in_group, as in attention.cu) of one (sequence, kv
// head); each warpgroup computes S = Q Kᵀ for its 64 rows over a BN-key tile with both operands in
// shared memory, runs the online softmax in registers, and accumulates O += P V with P taken
// straight from the S accumulators (their register layout is wgmma's A-operand layout) and V
// read transposed (MN-major) from shared memory. K/V tiles are gathered from the paged cache
// with cp.async into two stages laid out as wgmma's 128-byte-swizzled canonical tiles:
// [head_dim / 64][rows][64], row r's 16-byte chunk c stored at chunk c ^ (r % 8).
// FP8 (e4m3) caches (kFp8): the e4m3 tiles arrive with cp.async in two stages of their own and
// every thread then converts its share into one canonical tile of q's type (exact), which costs a
// second barrier per tile; the scales fold into the softmax scale (k) and the output (v).
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace atom::kernels::cuda {

namespace {

template <int D, int NWG, int BN, bool kFp8>
constexpr size_t wgmma_smem_bytes() {
  if constexpr (kFp8)  // Q, one converted K/V tile, two stages of e4m3 K/V
    return static_cast<size_t>(64 * NWG * D + 2 * BN * D) * 2 + 4 * BN * D + 1024;
  return static_cast<size_t>(64 * NWG * D + 4 * BN * D) * 2 + 1024;  // + alignment slack
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

template <typename T, int D, int NWG, int kBN, bool kFp8>
__global__ void __launch_bounds__(128 * NWG, NWG == 1 ? 2 : 1)
    wgmma_attention_kernel(AttnLaunch a) {
  pdl_wait();
  pdl_launch_dependents();
  constexpr int kBM = 64 * NWG, kThreads = 128 * NWG;
  constexpr int DC = D / 8;    // 16-byte chunks per row
  constexpr int NT = kBN / 8;  // 8-key blocks of S per tile
  constexpr int DT = D / 8;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  constexpr int kStages = kFp8 ? 1 : 2;  // canonical K/V tiles
  T* sQ = reinterpret_cast<T*>(base);    // [D/64][kBM][64]
  T* sK = sQ + kBM * D;                  // [kStages][D/64][kBN][64]
  T* sV = sK + kStages * kBN * D;        // [kStages][D/64][kBN][64]
  // FP8: [2][K, V][kBN][D] e4m3 stages
  uint8_t* sRaw = reinterpret_cast<uint8_t*>(sV + kStages * kBN * D);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
  const CtaRange r = cta_range(a, gridDim.x - 1 - blockIdx.x, kBM, kBN);  // long tiles first
  if (r.m0 >= r.rows) return;

  const T* qg = static_cast<const T*>(a.q);
  const T* kc = static_cast<const T*>(a.k_cache);
  const T* vc = static_cast<const T*>(a.v_cache);
  for (int idx = tid; idx < kBM * DC; idx += kThreads) {
    const int row = idx / DC, c = idx % DC;
    const int pr = r.m0 + row;
    const bool valid = pr < r.rows;
    const int i = valid ? pr / r.G : 0, g = valid ? pr % r.G : 0;
    const T* src = qg + static_cast<int64_t>(r.q0 + i) * a.q_stride +
                   static_cast<int64_t>(r.kh * r.G + g) * D + c * 8;
    cp_async16(smem_addr(sQ + tile_offset(kBM, row, c)), valid ? src : qg, valid);
  }
  const int32_t* pages = a.page_indices + a.page_indptr[r.s];
  auto load_kv = [&](int tile, int stage) {
    const int n0 = r.kv_begin + tile * kBN;
    if constexpr (kFp8) {  // e4m3 rows as they are, into raw stage `stage`
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
      return;
    }
    T* dk = sK + stage * kBN * D;
    T* dv = sV + stage * kBN * D;
    for (int idx = tid; idx < kBN * DC; idx += kThreads) {
      const int row = idx / DC, c = idx % DC;
      const int j = n0 + row;
      const bool valid = j < r.kv_end;
      const int64_t off = valid ? kv_row_offset(a, pages, j, r.kh) + c * 8 : 0;
      const int to = tile_offset(kBN, row, c);
      cp_async16(smem_addr(dk + to), kc + off, valid);
      cp_async16(smem_addr(dv + to), vc + off, valid);
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
  load_kv(0, 0);
  cp_async_commit();

  // This thread's two rows: lane/4 and lane/4 + 8 of its warp's 16 (wgmma accumulator layout).
  const int row0 = warp * 16 + (lane >> 2);
  int qpos[2];
  for (int h = 0; h < 2; ++h) qpos[h] = r.L - r.qlen + min((r.m0 + row0 + 8 * h) / r.G, r.qlen - 1);
  const bool wg_active = r.m0 + wg * 64 < r.rows;  // uniform over the warpgroup

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const uint32_t sQ_addr = smem_addr(sQ), sK_addr = smem_addr(sK), sV_addr = smem_addr(sV);
  const float qk_scale = kFp8 ? a.scale * a.k_scale : a.scale;
  const float scale_log2 = qk_scale * kLog2e;

  // One barrier per tile: it publishes tile t, and since every thread has passed it, all are done
  // with tile t - 1, whose stage the prefetch of tile t + 1 then refills.
  // FP8: the first barrier publishes raw tile t (and frees raw stage (t+1) % 2 and the canonical
  // tiles, whose last readers were tile t - 1's); the second publishes the converted tile.
  for (int t = 0; t < r.n_tiles; ++t) {
    const int stage = kFp8 ? 0 : t & 1;
    cp_async_wait<0>();
    if constexpr (kFp8) {
      __syncthreads();
      if (t + 1 < r.n_tiles) load_kv(t + 1, (t + 1) & 1);
      cp_async_commit();
      convert_kv(t & 1);
      fence_proxy_async();  // this thread's converted tiles, before the tensor cores read them
      __syncthreads();
    } else {
      fence_proxy_async();  // this thread's cp.async data, before the tensor cores read it
      __syncthreads();
      if (t + 1 < r.n_tiles) load_kv(t + 1, stage ^ 1);
      cp_async_commit();
    }
    if (wg_active) {
      const uint32_t k_addr = sK_addr + stage * (kBN * D * 2);
      const uint32_t v_addr = sV_addr + stage * (kBN * D * 2);
      float s[NT * 4];
#pragma unroll
      for (int i = 0; i < NT * 4; ++i) s[i] = 0.0f;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t qa = sQ_addr + (kk >> 2) * (kBM * 128) + wg * (64 * 128) + (kk & 3) * 32;
        const uint32_t kb = k_addr + (kk >> 2) * (kBN * 128) + (kk & 3) * 32;
        qk_mma<T, kBN>(s, wgmma_desc(qa, 16, 1024), wgmma_desc(kb, 16, 1024), kk > 0 ? 1 : 0);
      }
      wgmma_commit();
      wgmma_wait<0>();

      const int n0 = r.kv_begin + t * kBN;
      if (a.softcap > 0.0f) {
#pragma unroll
        for (int i = 0; i < NT * 4; ++i)
          s[i] = a.softcap * tanhf(s[i] * qk_scale / a.softcap) * kLog2e;
      } else {
#pragma unroll
        for (int i = 0; i < NT * 4; ++i) s[i] *= scale_log2;
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
        float mx = m_run[h];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          mx = fmaxf(mx, fmaxf(s[nt * 4 + 2 * h], s[nt * 4 + 2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_use = mx == -INFINITY ? 0.0f : mx;
        const float alpha = fast_exp2(m_run[h] - m_use);
        m_run[h] = mx;
        float rs = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float p0 = fast_exp2(s[nt * 4 + 2 * h] - m_use);
          const float p1 = fast_exp2(s[nt * 4 + 2 * h + 1] - m_use);
          s[nt * 4 + 2 * h] = p0;
          s[nt * 4 + 2 * h + 1] = p1;
          rs += p0 + p1;
        }
        l_run[h] = l_run[h] * alpha + rs;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          o[dt * 4 + 2 * h] *= alpha;
          o[dt * 4 + 2 * h + 1] *= alpha;
        }
      }
      uint32_t pa[kBN / 16][4];
#pragma unroll
      for (int kc2 = 0; kc2 < kBN / 16; ++kc2) {
        pa[kc2][0] = pack2<T>(s[(2 * kc2) * 4 + 0], s[(2 * kc2) * 4 + 1]);
        pa[kc2][1] = pack2<T>(s[(2 * kc2) * 4 + 2], s[(2 * kc2) * 4 + 3]);
        pa[kc2][2] = pack2<T>(s[(2 * kc2 + 1) * 4 + 0], s[(2 * kc2 + 1) * 4 + 1]);
        pa[kc2][3] = pack2<T>(s[(2 * kc2 + 1) * 4 + 2], s[(2 * kc2 + 1) * 4 + 3]);
      }
      wgmma_fence();
#pragma unroll
      for (int kc2 = 0; kc2 < kBN / 16; ++kc2) {
        // 16 keys = two 8-row groups (1024 B apart); the D/64 column blocks are kBN * 128 B apart.
        pv_mma<T, D>(o, pa[kc2], wgmma_desc(v_addr + kc2 * 16 * 128, kBN * 128, 1024));
      }
      wgmma_commit();
      wgmma_wait<0>();
    }
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
}

template <typename T, int D, int NWG, int BN, bool kFp8>
void launch_typed(const AttnLaunch& a, cudaStream_t s) {
  constexpr size_t smem = wgmma_smem_bytes<D, NWG, BN, kFp8>();
  static std::atomic<uint64_t> configured{0};
  max_dynamic_smem_once(configured, wgmma_attention_kernel<T, D, NWG, BN, kFp8>, static_cast<int>(smem));
  const int G = a.num_heads / a.num_kv_heads;
  const int64_t max_rows = static_cast<int64_t>(a.max_query_len) * G;
  const dim3 grid(static_cast<unsigned>((max_rows + 64 * NWG - 1) / (64 * NWG)),
                  static_cast<unsigned>(a.num_seqs * a.num_kv_heads), 1u);
  launch(wgmma_attention_kernel<T, D, NWG, BN, kFp8>, grid, 128 * NWG, smem, s, a);
}

// The CTA shape: a.wgmma_warpgroups (attention_config.h). FP8 caches: two warpgroups always
// (one instantiation fewer per type; the one-warpgroup shape measured slower with BF16).
template <typename T, int D>
void launch_shape(const AttnLaunch& a, cudaStream_t s) {
  if (a.kv_fp8)
    launch_typed<T, D, 2, 128, true>(a, s);
  else if (a.wgmma_warpgroups == 1)
    launch_typed<T, D, 1, 64, false>(a, s);
  else
    launch_typed<T, D, 2, 128, false>(a, s);
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
