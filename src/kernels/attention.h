#pragma once

#include "kernels/dispatch.h"

namespace atom::kernels {

// Per-tensor scales of an FP8 (F8E4M3) KV cache, vLLM's k_scale and v_scale: the cache stores
// e4m3(x / scale) (round to nearest even, saturating at +-448) and attention reads e4m3 * scale.
// Caches of any other dtype ignore them.
struct KvScales {
  float k = 1.0f;
  float v = 1.0f;
};

// Writes each token's key and value into its cache slot (slot < 0: skipped).
//   k_cache, v_cache [num_pages, block_size, Hk, D]: the activations' dtype, or F8E4M3
//   k, v [T, Hk * D] (rows may be strided)     slot_mapping [T] I32
namespace cpu {
void kv_cache_write(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
                    const Tensor& slot_mapping, KvScales scales = {});
}
namespace cuda {
void kv_cache_write(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
                    const Tensor& slot_mapping, KvScales scales = {});
}

inline void kv_cache_write(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
                           const Tensor& slot_mapping, KvScales scales = {}) {
  check_same_device("kv_cache_write", k_cache.device(), {&v_cache, &k, &v, &slot_mapping});
  if (k_cache.device().is_cpu())
    return cpu::kv_cache_write(k_cache, v_cache, k, v, slot_mapping, scales);
  ATOM_KERNEL_CUDA("kv_cache_write",
                   cuda::kv_cache_write(k_cache, v_cache, k, v, slot_mapping, scales));
}

// Attention of each sequence's new tokens over its whole cached context (prefill, chunked
// prefill, prefix-cached prefill and decode alike). Query i of a sequence with q new tokens and
// context L sits at context index L - q + i and sees keys j <= that index (and, with a sliding
// window W, j > index - W); with causal off, every query sees all L keys.
struct AttentionArgs {
  int num_heads = 0;     // query heads on this rank
  int num_kv_heads = 0;  // key/value heads on this rank
  int head_dim = 0;
  float scale = 1.0f;
  int sliding_window = 0;      // 0: full attention
  float logit_softcap = 0.0f;  // 0: none
  // false: every query sees its sequence's whole context, none masked by position (an encoder's
  // attention over its sequence; sliding_window must be 0).
  bool causal = true;
  // Upper bounds over the batch (CUDA sizes its grid and its context split from them, so a
  // CUDA graph may be captured with bounds that hold for every replay).
  int max_query_len = 0;
  int max_context_len = 0;
  KvScales kv_scales;  // F8E4M3 caches only
};

//   out [T, Hq * D]    q [T, Hq * D] (rows may be strided)
//   caches as in kv_cache_write (CUDA: q's dtype, or F8E4M3 read through a.kv_scales)
//   query_start [S + 1], context_lens [S], page_indptr [S + 1], page_indices [pages]: I32
//   sinks [Hq] F32 or undefined: a per-head logit added to the softmax denominator
struct AttentionBatch {
  const Tensor* query_start;
  const Tensor* context_lens;
  const Tensor* page_indptr;
  const Tensor* page_indices;
  // F32 scratch of paged_attention_workspace_size() elements, for the partial results of a
  // context split across thread blocks (CUDA decode); null or smaller: no split.
  Tensor* workspace = nullptr;
};

// F32 elements of scratch paged_attention can use for `num_tokens` query tokens (0 on the CPU).
namespace cuda {
int64_t paged_attention_workspace_size(int64_t num_tokens, const AttentionArgs& a, DType dtype);
}
inline int64_t paged_attention_workspace_size(Device device, int64_t num_tokens,
                                              const AttentionArgs& a, DType dtype) {
  if (device.is_cpu()) return 0;
#ifdef ATOM_HAVE_CUDA
  return cuda::paged_attention_workspace_size(num_tokens, a, dtype);
#else
  return 0;
#endif
}

namespace cpu {
void paged_attention(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const AttentionBatch& b, const Tensor& sinks, const AttentionArgs& a);
}
namespace cuda {
void paged_attention(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const AttentionBatch& b, const Tensor& sinks, const AttentionArgs& a);
}

inline void paged_attention(Tensor& out, const Tensor& q, const Tensor& k_cache,
                            const Tensor& v_cache, const AttentionBatch& b, const Tensor& sinks,
                            const AttentionArgs& a) {
  check_same_device("paged_attention", out.device(),
                    {&q, &k_cache, &v_cache, b.query_start, b.context_lens, b.page_indptr,
                     b.page_indices, &sinks});
  if (out.device().is_cpu()) return cpu::paged_attention(out, q, k_cache, v_cache, b, sinks, a);
  ATOM_KERNEL_CUDA("paged_attention", cuda::paged_attention(out, q, k_cache, v_cache, b, sinks, a));
}

}  // namespace atom::kernels
