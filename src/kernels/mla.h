// Multi-head latent attention (DeepSeek-V2/V3, V3.2, GLM-5) over a paged latent cache, and the
// sparse-attention indexer (DeepSeek-V3.2, GLM-5) that picks the context positions each query
// attends to.
//
// The latent cache (CacheKind::kLatent) holds one row per token: (c_kv | k_pe), c_kv the
// kv_a_layernorm'd latent of width L = kv_lora_rank, k_pe the rotated shared key of width
// R = qk_rope_head_dim. Attention runs "absorbed": each head's query is (W_UKᵀ q_nope | q_pe), of
// width L + R, its keys are the cached rows and its value is c_kv, so prefill, chunked prefill,
// prefix-cached prefill and decode are one code path over the cache (the caller applies W_UV to
// the L-wide output per head). This is the FlashMLA problem: many query heads share one latent.
#pragma once

#include "kernels/attention.h"
#include "kernels/dispatch.h"
#include "kernels/index_plane.h"

namespace atom::kernels {

// RoPE of MLA's rotary parts, then the latent cache write:
//   q  [T, H * (nope + R)] (rows may be strided): each head's last R channels (q_pe) rotated in
//      place; its first nope channels are left alone
//   kv [T, L + R] (rows may be strided): (c_kv | k_pe); k_pe rotated in place, then the whole row
//      written to latent_cache [num_pages, block_size, 1, L + R] at slot_mapping[t] (< 0: skipped)
//   positions [T] I32, inv_freq [R / 2] F32: angle = float(pos) * inv_freq[i], in fp32
//   scale multiplies cos and sin (YaRN's attention factor); interleaved: pairs (2i, 2i + 1)
//   rotated (DeepSeek's layout) instead of halves (i, i + R / 2)
struct MlaRopeArgs {
  int num_heads = 0;   // on this rank
  int nope_dim = 0;    // qk_nope_head_dim
  int rope_dim = 0;    // qk_rope_head_dim (R)
  int latent_dim = 0;  // kv_lora_rank (L)
  float scale = 1.0f;
  bool interleaved = false;
};

namespace cpu {
void mla_rope_cache_write(Tensor& q, Tensor& kv, const Tensor& positions, const Tensor& inv_freq,
                          const MlaRopeArgs& a, Tensor& latent_cache, const Tensor& slot_mapping);
}
namespace cuda {
void mla_rope_cache_write(Tensor& q, Tensor& kv, const Tensor& positions, const Tensor& inv_freq,
                          const MlaRopeArgs& a, Tensor& latent_cache, const Tensor& slot_mapping);
}

inline void mla_rope_cache_write(Tensor& q, Tensor& kv, const Tensor& positions,
                                 const Tensor& inv_freq, const MlaRopeArgs& a, Tensor& latent_cache,
                                 const Tensor& slot_mapping) {
  check_same_device("mla_rope_cache_write", q.device(),
                    {&kv, &positions, &inv_freq, &latent_cache, &slot_mapping});
  if (q.device().is_cpu())
    return cpu::mla_rope_cache_write(q, kv, positions, inv_freq, a, latent_cache, slot_mapping);
  ATOM_KERNEL_CUDA("mla_rope_cache_write", cuda::mla_rope_cache_write(q, kv, positions, inv_freq, a,
                                                                      latent_cache, slot_mapping));
}

// Writes rows [T, W] (rows may be strided) into a one-row-per-token cache
// [num_pages, block_size, 1, W] (a latent plane, an indexer key plane) at slot_mapping[t]
// (< 0: skipped), converting to the cache's dtype.
namespace cpu {
void cache_rows_write(Tensor& cache, const Tensor& rows, const Tensor& slot_mapping);
}
namespace cuda {
void cache_rows_write(Tensor& cache, const Tensor& rows, const Tensor& slot_mapping);
}

inline void cache_rows_write(Tensor& cache, const Tensor& rows, const Tensor& slot_mapping) {
  check_same_device("cache_rows_write", cache.device(), {&rows, &slot_mapping});
  if (cache.device().is_cpu()) return cpu::cache_rows_write(cache, rows, slot_mapping);
  ATOM_KERNEL_CUDA("cache_rows_write", cuda::cache_rows_write(cache, rows, slot_mapping));
}

// Absorbed latent attention of each sequence's new tokens over its cached latent rows. Query i
// of a sequence with q new tokens and context n sits at context index n - q + i and sees rows
// j <= that index (as paged_attention), or, with `topk` defined, only the positions its row of
// topk names (entries < 0 unused: sparse attention over the indexer's choice).
//   out [T, H * L] (rows may be strided): per head Σ_j p_j c_j, p = softmax_j(scale · q_h · row_j)
//   q   [T, H * (L + R)] (rows may be strided): per head (W_UKᵀ q_nope | q_pe)
//   latent_cache [num_pages, block_size, 1, L + R]: any float dtype on the CPU
//   topk [T, K] I32 or undefined
struct MlaArgs {
  int num_heads = 0;   // on this rank
  int latent_dim = 0;  // L: the value's width, the first L channels of a row
  int rope_dim = 0;    // R
  float scale = 1.0f;  // qk_head_dim^-0.5, times YaRN's mscale² where the model says so
  // Upper bounds over the batch (as AttentionArgs).
  int max_query_len = 0;
  int max_context_len = 0;
};

// F32 elements of scratch mla_paged_attention can use for `num_tokens` query tokens (CUDA: the
// partial results of a context split across thread blocks; 0 on the CPU). top_k: the width of
// the topk argument, 0 for dense attention. Pass it as the batch's workspace.
namespace cuda {
int64_t mla_paged_attention_workspace_size(int64_t num_tokens, const MlaArgs& a, DType dtype,
                                           int64_t top_k);
// The kernel (wgmma or the FP32 one-block-per-head one) and the wgmma loop are
// CudaTuning::mla_simple and mla_pipeline (kernels/cuda_tuning.h).
}  // namespace cuda
inline int64_t mla_paged_attention_workspace_size(Device device, int64_t num_tokens,
                                                  const MlaArgs& a, DType dtype, int64_t top_k) {
  if (device.is_cpu()) return 0;
#ifdef ATOM_HAVE_CUDA
  return cuda::mla_paged_attention_workspace_size(num_tokens, a, dtype, top_k);
#else
  return 0;
#endif
}

namespace cpu {
void mla_paged_attention(Tensor& out, const Tensor& q, const Tensor& latent_cache,
                         const AttentionBatch& b, const Tensor& topk, const MlaArgs& a);
}
namespace cuda {
void mla_paged_attention(Tensor& out, const Tensor& q, const Tensor& latent_cache,
                         const AttentionBatch& b, const Tensor& topk, const MlaArgs& a);
}

inline void mla_paged_attention(Tensor& out, const Tensor& q, const Tensor& latent_cache,
                                const AttentionBatch& b, const Tensor& topk, const MlaArgs& a) {
  check_same_device(
      "mla_paged_attention", out.device(),
      {&q, &latent_cache, b.query_start, b.context_lens, b.page_indptr, b.page_indices, &topk});
  if (out.device().is_cpu()) return cpu::mla_paged_attention(out, q, latent_cache, b, topk, a);
  ATOM_KERNEL_CUDA("mla_paged_attention",
                   cuda::mla_paged_attention(out, q, latent_cache, b, topk, a));
}

// The lightning indexer's choice (DeepSeek-V3.2, GLM-5): for each new token t (at context index
// i, as above) and every visible position j <= i,
//   score_j = Σ_h (weights[t, h] · weights_scale) · relu(scale · q[t, h] · key_j)   (fp32)
// and topk[t] = the top_k positions by score, in descending score order (ties: the lower
// position first); a query seeing fewer than top_k positions gets all of them, then -1 entries.
//   topk [T, top_k] I32 contiguous
//   q [T, Hi * D] (rows may be strided), weights [T, Hi] F32 (rows may be strided)
//   key_cache [num_pages, block_size, 1, D] (CacheKind::kIndexerKey)
struct IndexerArgs {
  int num_heads = 0;   // index_n_heads
  int head_dim = 0;    // index_head_dim
  float scale = 1.0f;  // index_head_dim^-0.5
  int top_k = 0;       // index_topk
  int max_query_len = 0;
  int max_context_len = 0;
  float weights_scale = 1.0f;  // index_n_heads^-0.5
  // key_cache holds one row per entry_tokens tokens (DeepSeek-V4's compressed entries, pages of a
  // multiple of it: block_size / entry_tokens rows a page): a token at context index i sees the
  // rows j < (i + 1) / entry_tokens, and max_context_len counts rows.
  int entry_tokens = 1;
  // DeepSeek-V4.1's quantised index plane (kernels/index_plane.h): kFp8, key_cache U8 [num_pages,
  // rows, 1, D + 4] (codes and the row's F32 scale); kFp4, key_cache U8 [.., D / 2] with
  // IndexerPlanes::key_scales U8 [.., D / 32]. Each query head is rounded as the scorers take it
  // (index_fp8_round_query / index_fp4_round_query) before its products.
  IndexKeyFormat key_format = IndexKeyFormat::kPlain;
  // Ties at equal scores: the higher position first (V4.1's index_topk_tie_break
  // "large_position"); else the lower.
  bool large_position_first = false;
  // Rows a candidate block (IndexerPlanes' candidates; V4.1's candidate_block_size).
  int candidate_block = 0;
};

// The indexer's optional planes (null: none).
struct IndexerPlanes {
  const Tensor* key_scales = nullptr;  // kFp4's scales
  // [T, C] I32 block ids (-1 unused): only the rows of these blocks (row j in block j /
  // candidate_block) are chosen from; a query with fewer than top_k such rows gets them all, then
  // -1 entries. (V4.1's layers after its candidate source.)
  const Tensor* candidates_in = nullptr;
  // [T, C] I32 out: each query's C blocks of the highest maximum score over its visible rows, the
  // newest block (holding the last visible row) always kept, ties the lower block first, in
  // ascending block order, then -1 entries. (V4.1's candidate source; its own top_k is
  // unrestricted.)
  Tensor* candidates_out = nullptr;
};

// F32 elements of scratch indexer_topk needs (CUDA: every token's scores, num_tokens x
// max_context_len, and with candidate_block its blocks' maxima; 0 on the CPU). Pass it as the
// batch's workspace.
namespace cuda {
int64_t indexer_topk_workspace_size(int64_t num_tokens, const IndexerArgs& a);
}
inline int64_t indexer_topk_workspace_size(Device device, int64_t num_tokens,
                                           const IndexerArgs& a) {
  if (device.is_cpu()) return 0;
#ifdef ATOM_HAVE_CUDA
  return cuda::indexer_topk_workspace_size(num_tokens, a);
#else
  return 0;
#endif
}

namespace cpu {
void indexer_topk(Tensor& topk, const Tensor& q, const Tensor& weights, const Tensor& key_cache,
                  const AttentionBatch& b, const IndexerArgs& a, const IndexerPlanes& p);
}
namespace cuda {
void indexer_topk(Tensor& topk, const Tensor& q, const Tensor& weights, const Tensor& key_cache,
                  const AttentionBatch& b, const IndexerArgs& a, const IndexerPlanes& p);
}

// The key cache's and the optional planes' checks (every backend).
void indexer_cache_check(const char* op, const Tensor& topk, const Tensor& key_cache,
                         const IndexerArgs& a, const IndexerPlanes& p);

inline void indexer_topk(Tensor& topk, const Tensor& q, const Tensor& weights,
                         const Tensor& key_cache, const AttentionBatch& b, const IndexerArgs& a,
                         const IndexerPlanes& p = {}) {
  check_same_device("indexer_topk", topk.device(),
                    {&q, &weights, &key_cache, b.query_start, b.context_lens, b.page_indptr,
                     b.page_indices, p.key_scales, p.candidates_in, p.candidates_out});
  if (topk.device().is_cpu()) return cpu::indexer_topk(topk, q, weights, key_cache, b, a, p);
  ATOM_KERNEL_CUDA("indexer_topk", cuda::indexer_topk(topk, q, weights, key_cache, b, a, p));
}

// The k-pool indexer's choice (GLM-5.3's Glm5NextTextIndexer). Each token's row of rows_cache
// [num_pages, block_size, 1, 2 D] holds (its LayerNorm'd key | its gate scores). Pool j of a
// sequence is its tokens [j P, (j + 1) P); its key, per channel d, is the gated softmax pooling
//   k_j[d] = Σ_u softmax_u(gate[j P + u, d] + ape[u, d]) key[j P + u, d]          (fp32)
// A new token t at context index i (as above) sees the n = (i + 1) / P pools complete by i:
//   score_j = Σ_h (weights[t, h] · weights_scale) · relu(scale · q[t, h] · k_j)   (fp32)
// and out[t] = the top min(top_k / P, n) pools by score (ties: the lower pool first), each as its
// P positions in that order, then with `tail` the positions n P .. i of the incomplete pool, then
// -1 entries.
//   out [T, width()] I32 contiguous
//   q [T, Hi * D] (rows may be strided), weights [T, Hi] F32 (rows may be strided)
//   ape [P, D] F32
struct KpoolArgs {
  int num_heads = 0;           // index_n_heads
  int head_dim = 0;            // index_head_dim (D)
  int pool = 1;                // index_kpool (P)
  int top_k = 0;               // index_topk, in tokens: a multiple of P
  bool tail = true;            // index_kpool_always_select_tail
  float scale = 1.0f;          // index_head_dim^-0.5
  float weights_scale = 1.0f;  // index_n_heads^-0.5
  int max_query_len = 0;
  int max_context_len = 0;
  int width() const { return top_k + (tail ? pool - 1 : 0); }
};

// F32 elements of scratch kpool_topk needs (CUDA: the pooled keys, every token's pool scores and
// chosen pools; 0 on the CPU). Pass it as the batch's workspace.
namespace cuda {
int64_t kpool_topk_workspace_size(int64_t num_tokens, int64_t num_seqs, const KpoolArgs& a);
}
inline int64_t kpool_topk_workspace_size(Device device, int64_t num_tokens, int64_t num_seqs,
                                         const KpoolArgs& a) {
  if (device.is_cpu()) return 0;
#ifdef ATOM_HAVE_CUDA
  return cuda::kpool_topk_workspace_size(num_tokens, num_seqs, a);
#else
  return 0;
#endif
}

// kpool_topk's shape and dtype checks, shared by the backends (each adds its own limits).
inline void kpool_topk_check(const Tensor& out, const Tensor& q, const Tensor& weights,
                             const Tensor& rows_cache, const Tensor& ape, const KpoolArgs& a) {
  const int H = a.num_heads, D = a.head_dim, P = a.pool;
  const int64_t T = q.size(0);
  ATOM_CHECK(H > 0 && D > 0 && P > 0 && a.top_k > 0 && a.top_k % P == 0,
             "kpool_topk: {} heads of {}, pools of {}, top {}", H, D, P, a.top_k);
  ATOM_CHECK(q.dim() == 2 && (q.size(1) <= 1 || q.stride(1) == 1) && weights.dim() == 2 &&
                 (weights.size(1) <= 1 || weights.stride(1) == 1),
             "kpool_topk: q {} and weights {} must be 2-D with contiguous rows", q.str(),
             weights.str());
  ATOM_CHECK(q.size(1) == static_cast<int64_t>(H) * D && weights.size(0) == T &&
                 weights.size(1) == H && weights.dtype() == DType::kF32 &&
                 ape.dtype() == DType::kF32 && ape.is_contiguous() && ape.numel() == P * D,
             "kpool_topk: q {} weights {} ape {} for {} heads of {}, pools of {}", q.str(),
             weights.str(), ape.str(), H, D, P);
  ATOM_CHECK(out.dim() == 2 && out.size(0) == T && out.size(1) == a.width() &&
                 out.is_contiguous() && out.dtype() == DType::kI32,
             "kpool_topk: out {} must be contiguous I32 [{}, {}]", out.str(), T, a.width());
  ATOM_CHECK(rows_cache.dim() == 4 && rows_cache.is_contiguous() && rows_cache.size(2) == 1 &&
                 rows_cache.size(3) == 2 * D,
             "kpool_topk: cache {} must be [num_pages, block_size, 1, {}]", rows_cache.str(),
             2 * D);
}

namespace cpu {
void kpool_topk(Tensor& out, const Tensor& q, const Tensor& weights, const Tensor& rows_cache,
                const Tensor& ape, const AttentionBatch& b, const KpoolArgs& a);
}
namespace cuda {
void kpool_topk(Tensor& out, const Tensor& q, const Tensor& weights, const Tensor& rows_cache,
                const Tensor& ape, const AttentionBatch& b, const KpoolArgs& a);
}

inline void kpool_topk(Tensor& out, const Tensor& q, const Tensor& weights,
                       const Tensor& rows_cache, const Tensor& ape, const AttentionBatch& b,
                       const KpoolArgs& a) {
  check_same_device("kpool_topk", out.device(),
                    {&q, &weights, &rows_cache, &ape, b.query_start, b.context_lens, b.page_indptr,
                     b.page_indices});
  if (out.device().is_cpu()) return cpu::kpool_topk(out, q, weights, rows_cache, ape, b, a);
  ATOM_KERNEL_CUDA("kpool_topk", cuda::kpool_topk(out, q, weights, rows_cache, ape, b, a));
}

}  // namespace atom::kernels
