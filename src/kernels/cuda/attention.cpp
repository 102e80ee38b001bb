// CUDA entry point of paged attention: picks the tensor-core flash kernel (BF16/F16, head_dim
// 64/128/256; its FP8-cache twin for F8E4M3 caches) or the simple FP32 kernel, and how far to
// split long contexts across CTAs.
#include "kernels/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "kernels/cuda_tuning.h"
#include "kernels/cuda/host_common.h"

namespace atom::kernels::cuda {

namespace {

constexpr int kMaxSplits = 32;
// AttnLaunch::window for non-causal attention (AttentionArgs::causal off): the kernels read a
// negative window as "every query at position L - 1" (attention_common.cuh's cta_range and each
// kernel's per-row positions), so all L keys are visible and no sliding window applies.
constexpr int kNonCausalWindow = -1;
constexpr int kDecodeTileKeys = 64;  // kDecodeBlockN (attention_common.cuh)

bool tensor_core_shape(const AttentionArgs& a, DType dtype, const CudaTuning& tuning) {
  return (dtype == DType::kBF16 || dtype == DType::kF16) &&
         (a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256) &&
         tuning.attention_backend != PrefillAttention::kSimple;
}

// Decode mode: every sequence's rows of one kv-head group fit one 16-row MMA tile.
bool decode_mode(const AttentionArgs& a) {
  const int G = a.num_heads / a.num_kv_heads;
  return static_cast<int64_t>(a.max_query_len) * G <= kDecodeRows;
}

// 16-row MMA atoms per warp of the mma.sync prefill kernel: two for long queries (each K/V
// fragment read from shared memory then serves twice the rows).
int m_atoms_for(const AttentionArgs& a, const CudaTuning& tuning) {
  if (a.head_dim > 128) return 1;
  if (tuning.attention_m_atoms == 1 || tuning.attention_m_atoms == 2)
    return tuning.attention_m_atoms;
  const int G = a.num_heads / a.num_kv_heads;
  return static_cast<int64_t>(a.max_query_len) * G > 64 ? 2 : 1;
}

// Decode splits of each sequence's keys: enough CTAs for two per SM, each split at least
// attention_split_min_tiles tiles of keys. A bound from sizes only (never the batch's data), so
// a captured graph stays valid; each sequence then uses as many of them as its own length allows
// (decode_splits).
int splits_for(int64_t num_tokens, const AttentionArgs& a) {
  const int64_t ctas = std::max<int64_t>(1, num_tokens * a.num_kv_heads);
  const int64_t want = (2 * sm_count() + ctas - 1) / ctas;
  const int64_t keys = int64_t{kDecodeTileKeys} * cuda_tuning().attention_split_min_tiles;
  const int64_t by_len = (a.max_context_len + keys - 1) / keys;
  return static_cast<int>(std::clamp<int64_t>(std::min(want, by_len), 1, kMaxSplits));
}

// Zeroed split tickets of one stream (kernels re-zero what they use). Fixed size and kept for
// the process, so CUDA graphs can hold the address; created on first use, which is never inside
// a capture (runners warm up eagerly first).
constexpr int64_t kCounters = 1 << 16;
int* split_counters(cudaStream_t stream) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, int*> buffers;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  int*& p = buffers[{dev, stream}];
  if (!p) {
    CUDA_CHECK(cudaMalloc(&p, kCounters * sizeof(int)));
    CUDA_CHECK(cudaMemsetAsync(p, 0, kCounters * sizeof(int), stream));
  }
  return p;
}

}  // namespace

int sm_count() {
  static std::atomic<int> counts[64] = {};
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::atomic<int>& c = counts[dev & 63];
  int n = c.load(std::memory_order_relaxed);
  if (n == 0) {
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    c.store(n, std::memory_order_relaxed);
  }
  return n;
}

int64_t paged_attention_workspace_size(int64_t num_tokens, const AttentionArgs& a, DType dtype) {
  if (!tensor_core_shape(a, dtype, cuda_tuning()) || a.num_kv_heads <= 0 || !decode_mode(a))
    return 0;
  const int splits = splits_for(num_tokens, a);
  if (splits <= 1) return 0;
  return static_cast<int64_t>(splits) * num_tokens * a.num_heads * (a.head_dim + 2);
}

void paged_attention(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const AttentionBatch& b, const Tensor& sinks, const AttentionArgs& a) {
  check_rows("paged_attention", out, "out");
  check_rows("paged_attention", q, "q");
  const int Hq = a.num_heads, Hk = a.num_kv_heads, D = a.head_dim;
  ATOM_CHECK(Hq > 0 && Hk > 0 && Hq % Hk == 0 && D > 0 && D <= 256,
             "paged_attention: {} heads over {} kv heads of {}", Hq, Hk, D);
  ATOM_CHECK(q.size(1) == static_cast<int64_t>(Hq) * D && out.size(1) == q.size(1) &&
                 out.size(0) == q.size(0),
             "paged_attention: q {} out {}", q.str(), out.str());
  ATOM_CHECK(k_cache.dim() == 4 && k_cache.size(2) == Hk && k_cache.size(3) == D &&
                 k_cache.is_contiguous() && v_cache.is_contiguous() &&
                 v_cache.shape() == k_cache.shape(),
             "paged_attention: cache {} for {} kv heads of {}", k_cache.str(), Hk, D);
  const bool fp8 = k_cache.dtype() == DType::kF8E4M3;
  ATOM_CHECK(q.dtype() == out.dtype() && (k_cache.dtype() == q.dtype() || fp8) &&
                 v_cache.dtype() == k_cache.dtype(),
             "paged_attention: q {}, out {} and caches {} must share a dtype (or the caches be "
             "F8_E4M3) on CUDA",
             q.str(), out.str(), k_cache.str());
  const KvScales& ks = a.kv_scales;
  ATOM_CHECK(!fp8 || (std::isfinite(ks.k) && ks.k > 0 && std::isfinite(ks.v) && ks.v > 0),
             "paged_attention: kv scales k {} v {} must be positive and finite", ks.k, ks.v);
  ATOM_CHECK(!sinks.defined() || (sinks.numel() == Hq && sinks.dtype() == DType::kF32),
             "paged_attention: sinks {}", sinks.str());
  ATOM_CHECK(is_i32(*b.query_start) && is_i32(*b.context_lens) && is_i32(*b.page_indptr) &&
                 is_i32(*b.page_indices),
             "paged_attention: batch tensors must be contiguous I32");
  const int S = static_cast<int>(b.context_lens->numel());
  const int64_t T = q.size(0);
  if (S == 0 || T == 0) return;
  ATOM_CHECK(b.query_start->numel() == S + 1 && a.max_query_len > 0,
             "paged_attention: query_start {} for {} sequences, max_query_len {}",
             b.query_start->str(), S, a.max_query_len);

  AttnLaunch l;
  l.q = q.data();
  l.q_stride = T > 1 ? q.stride(0) : q.size(1);
  l.out = out.data();
  l.out_stride = T > 1 ? out.stride(0) : out.size(1);
  l.k_cache = k_cache.data();
  l.v_cache = v_cache.data();
  l.query_start = b.query_start->ptr<int32_t>();
  l.context_lens = b.context_lens->ptr<int32_t>();
  l.page_indptr = b.page_indptr->ptr<int32_t>();
  l.page_indices = b.page_indices->ptr<int32_t>();
  l.sinks = sinks.defined() ? sinks.ptr<float>() : nullptr;
  l.num_tokens = T;
  l.num_seqs = S;
  l.num_heads = Hq;
  l.num_kv_heads = Hk;
  l.head_dim = D;
  l.block_size = static_cast<int>(k_cache.size(1));
  ATOM_CHECK(a.causal || a.sliding_window == 0,
             "paged_attention: a sliding window needs causal attention");
  l.window = a.causal ? a.sliding_window : kNonCausalWindow;
  l.max_query_len = a.max_query_len;
  l.scale = a.scale;
  l.softcap = a.logit_softcap;
  l.type = elem_of(q.dtype(), "paged_attention");
  const CudaTuning& tuning = cuda_tuning();
  l.wgmma_warpgroups = tuning.wgmma_warpgroups;
  l.wgmma_pipeline = tuning.wgmma_pipeline;
  l.wgmma_order_across = tuning.wgmma_order_across;
  l.kv_fp8 = fp8;
  if (fp8) {
    l.k_scale = ks.k;
    l.v_scale = ks.v;
  }

  l.block_shift = (l.block_size & (l.block_size - 1)) == 0
                      ? __builtin_ctz(static_cast<unsigned>(l.block_size))
                      : -1;

  const cudaStream_t stream = current_stream();
  if (!tensor_core_shape(a, q.dtype(), tuning) || !flash_attention_supported(l)) {
    launch_attention_simple(l, stream);
    launch_check("paged_attention (simple)");
    return;
  }
  if (!decode_mode(a)) {
    if (tuning.attention_backend == PrefillAttention::kAuto && wgmma_attention_supported(l)) {
      launch_wgmma_attention(l, stream);
      launch_check("paged_attention (wgmma)");
    } else if (fp8) {
      launch_flash_fp8_attention(l, stream);
      launch_check("paged_attention (flash, fp8 cache)");
    } else {
      launch_flash_attention(l, m_atoms_for(a, tuning), stream);
      launch_check("paged_attention (flash)");
    }
    return;
  }
  int splits = splits_for(T, a);
  if (splits > 1) {
    const int64_t need = static_cast<int64_t>(splits) * T * Hq * (D + 2);
    if (b.workspace && b.workspace->dtype() == DType::kF32 && b.workspace->is_contiguous() &&
        b.workspace->numel() >= need) {
      l.part_o = b.workspace->ptr<float>();
      l.part_ml = l.part_o + static_cast<int64_t>(splits) * T * Hq * D;
    } else {
      splits = 1;
    }
  }
  l.num_splits = splits;
  l.split_min_tiles = tuning.attention_split_min_tiles;
  if (splits > 1 && tuning.attention_merge_in_kernel && static_cast<int64_t>(S) * Hk <= kCounters)
    l.counters = split_counters(stream);
  if (fp8) {
    launch_flash_fp8_decode(l, stream);
    launch_check("paged_attention (flash decode, fp8 cache)");
  } else {
    launch_flash_decode(l, stream);
    launch_check("paged_attention (flash decode)");
  }
  if (splits > 1 && l.counters == nullptr) {
    launch_attention_combine(l, stream);
    launch_check("paged_attention (combine)");
  }
}

}  // namespace atom::kernels::cuda
