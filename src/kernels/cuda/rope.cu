// Rotary embedding in place on q and k (one block per token, cos/sin computed once per token in
// shared memory), and the paged KV-cache write.
#include <algorithm>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/fp8.cuh"

namespace atom::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// With k_cache set, the block then copies its token's rotated k row and v row into the cache
// slot (slot_mapping; < 0 or past the cache: skipped), as e4m3 codes of x / scale when
// a.cache_fp8.
template <typename T>
__global__ void __launch_bounds__(kThreads) rope_kernel(RopeLaunch a, int hq, int hk) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float table[];  // cos [half], sin [half]
  const int64_t t = blockIdx.x;
  const int half = a.rot_dim / 2;
  float* cs = table;
  float* sn = table + half;
  const float pos = static_cast<float>(a.positions[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x)
    rope_cos_sin(pos, a.inv_freq[i], a.scale, cs[i], sn[i]);
  __syncthreads();
  const int total = (hq + hk) * half;
  T* qrow = reinterpret_cast<T*>(row_of(a.q, t));
  T* krow = reinterpret_cast<T*>(row_of(a.k, t));
  for (int p = threadIdx.x; p < total; p += blockDim.x) {
    const int h = p / half, i = p % half;
    T* row = h < hq ? qrow + static_cast<int64_t>(h) * a.head_dim
                    : krow + static_cast<int64_t>(h - hq) * a.head_dim;
    const int i1 = a.interleaved ? 2 * i : i;
    const int i2 = a.interleaved ? 2 * i + 1 : i + half;
    float y1, y2;
    rope_rotate(to_float<T>(row[i1]), to_float<T>(row[i2]), cs[i], sn[i], y1, y2);
    row[i1] = from_float<T>(y1);
    row[i2] = from_float<T>(y2);
  }
  if (a.k_cache == nullptr) return;
  const int64_t slot = a.slot_mapping[t];
  if (slot < 0 || slot >= a.num_slots) return;
  __syncthreads();  // the block's rotated k row is complete (global writes, visible in the block)
  const int64_t width = a.k.cols;
  const T* vrow = reinterpret_cast<const T*>(row_of(a.v, t));
  if (a.cache_fp8) {
    uint8_t* kd = static_cast<uint8_t*>(a.k_cache) + slot * width;
    uint8_t* vd = static_cast<uint8_t*>(a.v_cache) + slot * width;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
      // IEEE division, as the CPU reference (x / scale), then one rounding to e4m3.
      kd[i] =
          static_cast<uint8_t>(float2_to_fp8x2(__fdiv_rn(to_float<T>(krow[i]), a.k_scale), 0.0f));
      vd[i] =
          static_cast<uint8_t>(float2_to_fp8x2(__fdiv_rn(to_float<T>(vrow[i]), a.v_scale), 0.0f));
    }
    return;
  }
  T* kd = static_cast<T*>(a.k_cache) + slot * width;
  T* vd = static_cast<T*>(a.v_cache) + slot * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    kd[i] = krow[i];
    vd[i] = vrow[i];
  }
}

// The same for half-split rotation over the whole head (rot_dim == head_dim) with 16-byte aligned
// rows and a cache of q's type, built for latency (a decode step runs it at one token per
// sequence): each thread rotates 8 pairs (i, i + half) of one head with two 16-byte loads and
// stores, computing its own 8 angles (the same fp32 values the table above holds), and writes
// rotated k straight from registers into the cache; the v rows are copied by 16-byte words in
// the same pass. One round trip to memory instead of one per loop iteration. kNorm: the head's
// RMSNorm first (a.q_norm / a.k_norm), its sum of squares reduced over the hv consecutive lanes
// that hold the head (hv divides 32), each normalised value rounded to T as rms_norm stores it.
template <typename T, bool kNorm>
__global__ void __launch_bounds__(1024) rope_vec_kernel(RopeLaunch a, int hq, int hk) {
  static_assert(sizeof(T) == 2, "16-bit types: 8 elements per 16-byte word");
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const int half = a.rot_dim / 2, hv = half / 8;  // 16-byte words per half head
  const int rot_words = (hq + hk) * hv, v_words = hk * a.head_dim / 8;
  const int64_t slot = a.k_cache ? a.slot_mapping[t] : -1;
  const bool cache = slot >= 0 && slot < a.num_slots;
  const float pos = static_cast<float>(a.positions[t]);
  for (int p = threadIdx.x; p < rot_words + (cache ? v_words : 0); p += blockDim.x) {
    if (p >= rot_words) {  // v row word into the cache
      const int wv = p - rot_words;
      const uint4 x = reinterpret_cast<const uint4*>(row_of(a.v, t))[wv];
      reinterpret_cast<uint4*>(static_cast<T*>(a.v_cache) + slot * a.v.cols)[wv] = x;
      continue;
    }
    const int h = p / hv, i0 = (p % hv) * 8;
    T* row = h < hq
                 ? reinterpret_cast<T*>(row_of(a.q, t)) + static_cast<int64_t>(h) * a.head_dim
                 : reinterpret_cast<T*>(row_of(a.k, t)) + static_cast<int64_t>(h - hq) * a.head_dim;
    float x1[8], x2[8];
    load_vec<T, 8>(row + i0, x1);
    load_vec<T, 8>(row + i0 + half, x2);
    if constexpr (kNorm) {
      float ss = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += x1[j] * x1[j] + x2[j] * x2[j];
      // The head's lanes: the hv-aligned run of this lane (every one of them is here: rot_words
      // and the block are multiples of hv).
      const unsigned lane = threadIdx.x & 31u;
      const unsigned mask =
          hv == 32 ? 0xffffffffu : ((1u << hv) - 1u) << (lane & ~static_cast<unsigned>(hv - 1));
      for (int o = hv / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(mask, ss, o);
      const float inv = 1.0f / sqrtf(ss / static_cast<float>(a.head_dim) + a.norm_eps);
      const void* w = h < hq ? a.q_norm : a.k_norm;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        x1[j] = round_to<T>(
            rms_norm_apply<T>(x1[j], inv, load_elem(w, a.norm_type, i0 + j), a.norm_kind));
        x2[j] = round_to<T>(
            rms_norm_apply<T>(x2[j], inv, load_elem(w, a.norm_type, i0 + half + j), a.norm_kind));
      }
    }
    float y1[8], y2[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float c, s;
      rope_cos_sin(pos, a.inv_freq[i0 + j], a.scale, c, s);
      rope_rotate(x1[j], x2[j], c, s, y1[j], y2[j]);
    }
    store_vec<T, 8>(row + i0, y1);
    store_vec<T, 8>(row + i0 + half, y2);
    if (h >= hq && cache) {
      T* kd =
          static_cast<T*>(a.k_cache) + slot * a.k.cols + static_cast<int64_t>(h - hq) * a.head_dim;
      store_vec<T, 8>(kd + i0, y1);
      store_vec<T, 8>(kd + i0 + half, y2);
    }
  }
}

// One block per token; rows copied as 16-byte words when every row is aligned, else as T.
template <typename W>
__global__ void kv_write_kernel(char* k_cache, char* v_cache, int64_t num_slots, Mat k, Mat v,
                                const int32_t* slot_mapping, int64_t row_words) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0 || slot >= num_slots) return;
  const W* ks = reinterpret_cast<const W*>(row_of(k, t));
  const W* vs = reinterpret_cast<const W*>(row_of(v, t));
  W* kd = reinterpret_cast<W*>(k_cache) + slot * row_words;
  W* vd = reinterpret_cast<W*>(v_cache) + slot * row_words;
  for (int64_t i = threadIdx.x; i < row_words; i += blockDim.x) {
    kd[i] = ks[i];
    vd[i] = vs[i];
  }
}

// FP8 cache: one block per token; 8 elements per thread (16-byte loads, 8-byte stores) when
// every row is aligned, else one at a time. Stored: e4m3(x / scale), as the CPU reference.
template <typename T>
__global__ void kv_write_fp8_kernel(uint8_t* k_cache, uint8_t* v_cache, int64_t num_slots, Mat k,
                                    Mat v, const int32_t* slot_mapping, KvFp8 f, bool vec) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0 || slot >= num_slots) return;
  const int64_t width = k.cols;
  const T* rows[2] = {reinterpret_cast<const T*>(row_of(k, t)),
                      reinterpret_cast<const T*>(row_of(v, t))};
  uint8_t* dst[2] = {k_cache + slot * width, v_cache + slot * width};
  const float scale[2] = {f.k_scale, f.v_scale};
  constexpr int V = 16 / sizeof(T) < 8 ? 16 / sizeof(T) : 8;  // elements per vector load
  if (vec) {
    for (int64_t i = threadIdx.x * 8; i < width; i += blockDim.x * 8) {
#pragma unroll
      for (int kv = 0; kv < 2; ++kv) {
        float x[8];
#pragma unroll
        for (int h = 0; h < 8; h += V) {
          float part[V];
          load_vec<T, V>(rows[kv] + i + h, part);
#pragma unroll
          for (int e = 0; e < V; ++e) x[h + e] = part[e];
        }
        uint32_t w[2];
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const uint32_t lo =
              float2_to_fp8x2(__fdiv_rn(x[4 * p], scale[kv]), __fdiv_rn(x[4 * p + 1], scale[kv]));
          const uint32_t hi = float2_to_fp8x2(__fdiv_rn(x[4 * p + 2], scale[kv]),
                                              __fdiv_rn(x[4 * p + 3], scale[kv]));
          w[p] = lo | (hi << 16);
        }
        *reinterpret_cast<uint2*>(dst[kv] + i) = make_uint2(w[0], w[1]);
      }
    }
    return;
  }
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
#pragma unroll
    for (int kv = 0; kv < 2; ++kv)
      dst[kv][i] = static_cast<uint8_t>(
          float2_to_fp8x2(__fdiv_rn(to_float<T>(rows[kv][i]), scale[kv]), 0.0f));
  }
}

template <typename T>
void launch_kv_write_fp8(void* k_cache, void* v_cache, int64_t num_slots, Mat k, Mat v,
                         const int32_t* slot_mapping, KvFp8 f, cudaStream_t s) {
  const int64_t esize = sizeof(T);
  auto ok = [](const void* p, int n) { return (reinterpret_cast<uintptr_t>(p) & (n - 1)) == 0; };
  const bool vec = k.cols % 8 == 0 && (k.stride * esize) % 16 == 0 &&
                   (v.stride * esize) % 16 == 0 && ok(k.data, 16) && ok(v.data, 16) &&
                   ok(k_cache, 8) && ok(v_cache, 8);
  launch(kv_write_fp8_kernel<T>, static_cast<unsigned>(k.rows), 128, 0, s,
         static_cast<uint8_t*>(k_cache), static_cast<uint8_t*>(v_cache), num_slots, k, v,
         slot_mapping, f, vec);
}

}  // namespace

void launch_rope(const RopeLaunch& a, cudaStream_t s) {
  if (a.q.rows == 0) return;
  const int hq = static_cast<int>(a.q.cols / a.head_dim),
            hk = static_cast<int>(a.k.cols / a.head_dim);
  const size_t smem = static_cast<size_t>(a.rot_dim) * sizeof(float);
  const unsigned grid = static_cast<unsigned>(a.q.rows);
  auto ok16 = [](const void* p, int64_t stride_elems) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0 && (stride_elems * 2) % 16 == 0;
  };
  const bool vec = a.q.type != Elem::kF32 && !a.interleaved && a.rot_dim == a.head_dim &&
                   a.head_dim % 16 == 0 && !a.cache_fp8 && ok16(a.q.data, a.q.stride) &&
                   ok16(a.k.data, a.k.stride) && (a.k.cols * 2) % 16 == 0 &&
                   (!a.k_cache || (ok16(a.k_cache, a.k.cols) && ok16(a.v_cache, a.v.cols) &&
                                   ok16(a.v.data, a.v.stride) && a.v.cols == a.k.cols));
  const int hv = a.rot_dim / 16;  // the vectorised kernel's lanes a head
  const bool norm = a.q_norm != nullptr;
  const bool fused = norm && vec && hv <= 32 && (hv & (hv - 1)) == 0;
  if (norm && !fused) {
    // Not fusable: the two per-head norms first, then the rotation alone.
    launch_rms_norm(a.q, a.q, nullptr, a.q_norm, a.norm_type, a.head_dim, a.norm_eps, a.norm_kind,
                    s);
    launch_rms_norm(a.k, a.k, nullptr, a.k_norm, a.norm_type, a.head_dim, a.norm_eps, a.norm_kind,
                    s);
  }
  if (vec) {
    const int words = (hq + hk) * a.rot_dim / 16 + (a.k_cache ? hk * a.head_dim / 8 : 0);
    const unsigned threads = static_cast<unsigned>(std::min(1024, (words + 31) / 32 * 32));
    if (a.q.type == Elem::kBF16)
      launch(fused ? rope_vec_kernel<__nv_bfloat16, true> : rope_vec_kernel<__nv_bfloat16, false>,
             grid, threads, 0, s, a, hq, hk);
    else
      launch(fused ? rope_vec_kernel<__half, true> : rope_vec_kernel<__half, false>, grid, threads,
             0, s, a, hq, hk);
    return;
  }
  switch (a.q.type) {
    case Elem::kF32:
      launch(rope_kernel<float>, grid, kThreads, smem, s, a, hq, hk);
      break;
    case Elem::kBF16:
      launch(rope_kernel<__nv_bfloat16>, grid, kThreads, smem, s, a, hq, hk);
      break;
    case Elem::kF16:
      launch(rope_kernel<__half>, grid, kThreads, smem, s, a, hq, hk);
      break;
  }
}

void launch_kv_cache_write(void* k_cache, void* v_cache, int64_t num_slots, Mat k, Mat v,
                           const int32_t* slot_mapping, KvFp8 fp8, cudaStream_t s) {
  if (k.rows == 0) return;
  if (fp8.on) {
    switch (k.type) {
      case Elem::kF32:
        return launch_kv_write_fp8<float>(k_cache, v_cache, num_slots, k, v, slot_mapping, fp8, s);
      case Elem::kBF16:
        return launch_kv_write_fp8<__nv_bfloat16>(k_cache, v_cache, num_slots, k, v, slot_mapping,
                                                  fp8, s);
      case Elem::kF16:
        return launch_kv_write_fp8<__half>(k_cache, v_cache, num_slots, k, v, slot_mapping, fp8, s);
    }
  }
  const int64_t esize = elem_bytes(k.type);
  const int64_t row_bytes = k.cols * esize;
  auto ok16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  const bool vec = row_bytes % 16 == 0 && (k.stride * esize) % 16 == 0 &&
                   (v.stride * esize) % 16 == 0 && ok16(k.data) && ok16(v.data) && ok16(k_cache) &&
                   ok16(v_cache);
  const unsigned grid = static_cast<unsigned>(k.rows);
  char* kc = static_cast<char*>(k_cache);
  char* vc = static_cast<char*>(v_cache);
  if (vec)
    launch(kv_write_kernel<uint4>, grid, 128, 0, s, kc, vc, num_slots, k, v, slot_mapping,
           row_bytes / 16);
  else if (esize == 4)
    launch(kv_write_kernel<uint32_t>, grid, 128, 0, s, kc, vc, num_slots, k, v, slot_mapping,
           k.cols);
  else
    launch(kv_write_kernel<uint16_t>, grid, 128, 0, s, kc, vc, num_slots, k, v, slot_mapping,
           k.cols);
}

}  // namespace atom::kernels::cuda
