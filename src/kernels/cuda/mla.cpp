// CUDA entry points of multi-head latent attention (kernels/mla.h) and the indexer's LayerNorm
// (kernels/layer_norm.h): shape and dtype checks, then the launchers of mla.cu / mla_wgmma.cu.
#include "kernels/mla.h"

#include <algorithm>

#include "kernels/cuda/host_common.h"
#include "kernels/cuda_tuning.h"
#include "kernels/layer_norm.h"

namespace atom::kernels::cuda {

namespace {

void check_one_row_cache(const char* op, const Tensor& cache, int64_t width) {
  ATOM_CHECK(
      cache.dim() == 4 && cache.is_contiguous() && cache.size(2) == 1 && cache.size(3) == width,
      "{}: cache {} must be [num_pages, block_size, 1, {}]", op, cache.str(), width);
}

void check_batch(const char* op, const AttentionBatch& b) {
  ATOM_CHECK(is_i32(*b.query_start) && is_i32(*b.context_lens) && is_i32(*b.page_indptr) &&
                 is_i32(*b.page_indices),
             "{}: batch tensors must be contiguous I32", op);
  ATOM_CHECK(b.query_start->numel() == b.context_lens->numel() + 1,
             "{}: query_start {} for {} sequences", op, b.query_start->str(),
             b.context_lens->numel());
}

bool fast_shape(const MlaArgs& a, DType dtype) {
  return !cuda_tuning().mla_simple && (dtype == DType::kBF16 || dtype == DType::kF16) &&
         a.latent_dim == kMlaFastLatent && (a.rope_dim == kMlaFastRope || a.rope_dim == 0);
}

// Context splits of the wgmma kernel: enough CTAs for one wave, each split at least two 64-key
// tiles. From sizes and bounds only (max_context_len is an upper bound), so a captured graph
// stays valid; the CTA count assumes one sequence per query_len tokens.
int splits_for(int64_t num_tokens, const MlaArgs& a, int64_t top_k) {
  const int64_t H = a.num_heads, rows = kMlaFastRows;
  const int64_t ctas = top_k > 0
                           ? (H + rows - 1) / rows * num_tokens
                           : (std::max(1, a.max_query_len) * H + rows - 1) / rows *
                                 std::max<int64_t>(1, num_tokens / std::max(1, a.max_query_len));
  const int64_t want = (sm_count() + ctas - 1) / std::max<int64_t>(1, ctas);
  const int64_t keys = top_k > 0 ? top_k : a.max_context_len;
  const int64_t by_len = (keys + 2 * kMlaFastKeys - 1) / (2 * kMlaFastKeys);
  return static_cast<int>(std::clamp<int64_t>(std::min(want, by_len), 1, kMlaMaxSplits));
}

}  // namespace

int64_t mla_paged_attention_workspace_size(int64_t num_tokens, const MlaArgs& a, DType dtype,
                                           int64_t top_k) {
  if (!fast_shape(a, dtype)) return 0;
  const int splits = splits_for(num_tokens, a, top_k);
  if (splits <= 1) return 0;
  return static_cast<int64_t>(splits) * num_tokens * a.num_heads * (a.latent_dim + 2);
}

namespace {
int indexer_max_blocks(const IndexerArgs& a) {
  return a.candidate_block > 0
             ? (std::max(1, a.max_context_len) + a.candidate_block - 1) / a.candidate_block
             : 0;
}
}  // namespace

int64_t indexer_topk_workspace_size(int64_t num_tokens, const IndexerArgs& a) {
  return num_tokens * (std::max(1, a.max_context_len) + indexer_max_blocks(a));
}

namespace {
int64_t kpool_max_pools(const KpoolArgs& a) {
  return std::max<int64_t>(1, a.max_context_len / std::max(1, a.pool));
}

// The indexer's launch over a step's tokens (checked by the caller): the queries, weights and
// one-row-per-token cache, the batch, the heads; the caller sets top_k, the score rows' length
// and the outputs.
IndexerLaunch indexer_launch(const char* op, const Tensor& q, const Tensor& weights,
                             const Tensor& cache, const AttentionBatch& b, int heads, int dim,
                             float scale, float weights_scale) {
  const int64_t T = q.size(0);
  IndexerLaunch l;
  l.q = q.data();
  l.q_stride = T > 1 ? q.stride(0) : q.size(1);
  l.q_type = elem_of(q.dtype(), op);
  l.weights = weights.ptr<float>();
  l.weights_stride = T > 1 ? weights.stride(0) : weights.size(1);
  l.cache = cache.data();
  if (cache.dtype() != DType::kU8) l.cache_type = elem_of(cache.dtype(), op);
  l.block_size = static_cast<int>(cache.size(1));
  l.query_start = b.query_start->ptr<int32_t>();
  l.context_lens = b.context_lens->ptr<int32_t>();
  l.page_indptr = b.page_indptr->ptr<int32_t>();
  l.page_indices = b.page_indices->ptr<int32_t>();
  l.num_tokens = T;
  l.num_seqs = static_cast<int>(b.context_lens->numel());
  l.num_heads = heads;
  l.head_dim = dim;
  l.scale = scale;
  l.weights_scale = weights_scale;
  return l;
}
}  // namespace

// Pooled keys [S, pools, D], scores [T, pools], then the chosen pools [T, top_k / P] (I32).
int64_t kpool_topk_workspace_size(int64_t num_tokens, int64_t num_seqs, const KpoolArgs& a) {
  const int64_t pools = kpool_max_pools(a);
  return num_seqs * pools * a.head_dim + num_tokens * pools +
         num_tokens * (a.top_k / std::max(1, a.pool));
}

void cache_rows_write(Tensor& cache, const Tensor& rows, const Tensor& slot_mapping) {
  check_rows("cache_rows_write", rows, "rows");
  const int64_t W = rows.size(1), T = rows.size(0);
  check_one_row_cache("cache_rows_write", cache, W);
  ATOM_CHECK(slot_mapping.numel() == T && is_i32(slot_mapping),
             "cache_rows_write: slot_mapping {} for {} rows", slot_mapping.str(), T);
  launch_cache_rows_write(cache.data(), elem_of(cache.dtype(), "cache_rows_write"),
                          cache.size(0) * cache.size(1), mat_of(rows, "cache_rows_write"),
                          slot_mapping.ptr<int32_t>(), current_stream());
  launch_check("cache_rows_write");
}

void mla_rope_cache_write(Tensor& q, Tensor& kv, const Tensor& positions, const Tensor& inv_freq,
                          const MlaRopeArgs& a, Tensor& latent_cache, const Tensor& slot_mapping) {
  check_rows("mla_rope_cache_write", q, "q");
  check_rows("mla_rope_cache_write", kv, "kv");
  const int H = a.num_heads, N = a.nope_dim, R = a.rope_dim, L = a.latent_dim;
  const int64_t T = q.size(0);
  ATOM_CHECK(H > 0 && N >= 0 && R >= 0 && R % 2 == 0 && L > 0,
             "mla_rope_cache_write: {} heads, nope {} rope {} latent {}", H, N, R, L);
  ATOM_CHECK(q.size(1) == static_cast<int64_t>(H) * (N + R) && kv.size(0) == T &&
                 kv.size(1) == L + R && positions.numel() == T && is_i32(positions),
             "mla_rope_cache_write: q {} kv {} positions {} for {} heads of {} + {}, latent {}",
             q.str(), kv.str(), positions.str(), H, N, R, L);
  ATOM_CHECK(inv_freq.numel() == R / 2 && inv_freq.dtype() == DType::kF32,
             "mla_rope_cache_write: inv_freq {} for rope dim {}", inv_freq.str(), R);
  check_one_row_cache("mla_rope_cache_write", latent_cache, L + R);
  ATOM_CHECK(slot_mapping.numel() == T && is_i32(slot_mapping),
             "mla_rope_cache_write: slot_mapping {} for {} tokens", slot_mapping.str(), T);
  if (R == 0) return cache_rows_write(latent_cache, kv, slot_mapping);  // nothing to rotate
  MlaRopeLaunch l;
  l.q = mat_of(q, "mla_rope_cache_write");
  l.kv = mat_of(kv, "mla_rope_cache_write");
  l.positions = positions.ptr<int32_t>();
  l.inv_freq = inv_freq.ptr<float>();
  l.num_heads = H;
  l.nope_dim = N;
  l.rope_dim = R;
  l.latent_dim = L;
  l.scale = a.scale;
  l.interleaved = a.interleaved;
  l.cache = latent_cache.data();
  l.cache_type = elem_of(latent_cache.dtype(), "mla_rope_cache_write");
  l.num_slots = latent_cache.size(0) * latent_cache.size(1);
  l.slot_mapping = slot_mapping.ptr<int32_t>();
  launch_mla_rope_cache_write(l, current_stream());
  launch_check("mla_rope_cache_write");
}

void mla_paged_attention(Tensor& out, const Tensor& q, const Tensor& latent_cache,
                         const AttentionBatch& b, const Tensor& topk, const MlaArgs& a) {
  check_rows("mla_paged_attention", out, "out");
  check_rows("mla_paged_attention", q, "q");
  const int H = a.num_heads, L = a.latent_dim, R = a.rope_dim, W = L + R;
  const int64_t T = q.size(0);
  ATOM_CHECK(H > 0 && L > 0 && R >= 0, "mla_paged_attention: {} heads, latent {} rope {}", H, L, R);
  ATOM_CHECK(q.size(1) == static_cast<int64_t>(H) * W && out.size(0) == T &&
                 out.size(1) == static_cast<int64_t>(H) * L && out.dtype() == q.dtype(),
             "mla_paged_attention: q {} out {} for {} heads of {} + {}", q.str(), out.str(), H, L,
             R);
  check_one_row_cache("mla_paged_attention", latent_cache, W);
  check_batch("mla_paged_attention", b);
  int64_t K = 0;
  if (topk.defined()) {
    ATOM_CHECK(
        topk.dim() == 2 && topk.size(0) == T && topk.is_contiguous() && topk.dtype() == DType::kI32,
        "mla_paged_attention: topk {} must be contiguous I32 [{}, K]", topk.str(), T);
    K = topk.size(1);
  }
  const int S = static_cast<int>(b.context_lens->numel());
  if (S == 0 || T == 0) return;
  ATOM_CHECK(a.max_query_len > 0, "mla_paged_attention: max_query_len {}", a.max_query_len);
  MlaLaunch l;
  l.q = q.data();
  l.q_stride = T > 1 ? q.stride(0) : q.size(1);
  l.out = out.data();
  l.out_stride = T > 1 ? out.stride(0) : out.size(1);
  l.type = elem_of(q.dtype(), "mla_paged_attention");
  l.cache = latent_cache.data();
  l.cache_type = elem_of(latent_cache.dtype(), "mla_paged_attention");
  l.block_size = static_cast<int>(latent_cache.size(1));
  l.query_start = b.query_start->ptr<int32_t>();
  l.context_lens = b.context_lens->ptr<int32_t>();
  l.page_indptr = b.page_indptr->ptr<int32_t>();
  l.page_indices = b.page_indices->ptr<int32_t>();
  l.topk = K > 0 ? topk.ptr<int32_t>() : nullptr;
  l.top_k = static_cast<int>(K);
  l.num_tokens = T;
  l.num_seqs = S;
  l.num_heads = H;
  l.latent_dim = L;
  l.rope_dim = R;
  l.max_query_len = a.max_query_len;
  l.scale = a.scale;
  const cudaStream_t stream = current_stream();
  if (topk.defined() && K == 0) {  // nothing selected: zeros, as the CPU reference
    CUDA_CHECK(cudaMemset2DAsync(out.data(), l.out_stride * dtype_bytes(out.dtype(), 1), 0,
                                 out.size(1) * dtype_bytes(out.dtype(), 1), T, stream));
    return;
  }
  if (fast_shape(a, q.dtype()) && mla_fast_supported(l)) {
    int splits = splits_for(T, a, K);
    if (splits > 1) {
      const int64_t need = static_cast<int64_t>(splits) * T * H * (L + 2);
      if (b.workspace && b.workspace->dtype() == DType::kF32 && b.workspace->is_contiguous() &&
          b.workspace->numel() >= need) {
        l.part_o = b.workspace->ptr<float>();
        l.part_ml = l.part_o + static_cast<int64_t>(splits) * T * H * L;
      } else {
        splits = 1;
      }
    }
    l.num_splits = splits;
    l.pipeline = cuda_tuning().mla_pipeline == 1 ? 1 : 0;
    launch_mla_attention_fast(l, stream);
    launch_check("mla_paged_attention (wgmma)");
    return;
  }
  ATOM_CHECK(L <= kMlaSimpleMaxLatent && W <= kMlaSimpleMaxWidth,
             "mla_paged_attention: latent {} + rope {} beyond the CUDA kernels' {} / {}", L, R,
             kMlaSimpleMaxLatent, kMlaSimpleMaxWidth);
  launch_mla_attention_simple(l, stream);
  launch_check("mla_paged_attention (simple)");
}

void indexer_topk(Tensor& topk, const Tensor& q, const Tensor& weights, const Tensor& key_cache,
                  const AttentionBatch& b, const IndexerArgs& a, const IndexerPlanes& p) {
  check_rows("indexer_topk", q, "q");
  check_rows("indexer_topk", weights, "weights");
  const int Hi = a.num_heads, D = a.head_dim, K = a.top_k;
  const int64_t T = q.size(0);
  ATOM_CHECK(Hi > 0 && D > 0 && K > 0 && a.entry_tokens >= 1,
             "indexer_topk: {} heads of {}, top {}, rows of {} tokens", Hi, D, K, a.entry_tokens);
  ATOM_CHECK(Hi <= kIndexerMaxHeads && D <= kIndexerMaxHeadDim && K <= kIndexerMaxTopK,
             "indexer_topk: {} heads of {}, top {}: the CUDA kernels take up to {} heads of {} "
             "and top {}",
             Hi, D, K, kIndexerMaxHeads, kIndexerMaxHeadDim, kIndexerMaxTopK);
  ATOM_CHECK((Hi * D + Hi + 128 * (D + 1)) * 4 <= 200 * 1024,
             "indexer_topk: {} heads of {} need more shared memory than the CUDA score kernel "
             "has",
             Hi, D);
  ATOM_CHECK(q.size(1) == static_cast<int64_t>(Hi) * D && weights.size(0) == T &&
                 weights.size(1) == Hi && weights.dtype() == DType::kF32,
             "indexer_topk: q {} weights {} for {} heads of {}", q.str(), weights.str(), Hi, D);
  ATOM_CHECK(topk.dim() == 2 && topk.size(0) == T && topk.size(1) == K && topk.is_contiguous() &&
                 topk.dtype() == DType::kI32,
             "indexer_topk: topk {} must be contiguous I32 [{}, {}]", topk.str(), T, K);
  indexer_cache_check("indexer_topk", topk, key_cache, a, p);
  ATOM_CHECK(!p.candidates_out || p.candidates_out->size(1) <= 1024,
             "indexer_topk: {} candidate blocks: the CUDA kernel keeps up to 1,024",
             p.candidates_out ? p.candidates_out->size(1) : 0);
  check_batch("indexer_topk", b);
  const int S = static_cast<int>(b.context_lens->numel());
  if (S == 0 || T == 0) return;
  const int64_t need = indexer_topk_workspace_size(T, a);
  ATOM_CHECK(b.workspace && b.workspace->dtype() == DType::kF32 && b.workspace->is_contiguous() &&
                 b.workspace->numel() >= need,
             "indexer_topk: needs an F32 workspace of {} elements (indexer_topk_workspace_size)",
             need);
  IndexerLaunch l =
      indexer_launch("indexer_topk", q, weights, key_cache, b, Hi, D, a.scale, a.weights_scale);
  l.topk = topk.ptr<int32_t>();
  l.top_k = K;
  l.max_context_len = std::max(1, a.max_context_len);
  l.scores = b.workspace->ptr<float>();
  l.pool = a.entry_tokens;  // rows of the cache itself (l.pooled stays null)
  l.key_format = static_cast<int>(a.key_format);
  l.key_width = static_cast<int>(key_cache.size(3));
  l.key_scales = p.key_scales ? p.key_scales->ptr<uint8_t>() : nullptr;
  l.large_position_first = a.large_position_first;
  l.cand_block = a.candidate_block;
  if (p.candidates_in) {
    l.cand_in = p.candidates_in->ptr<int32_t>();
    l.cand_in_count = static_cast<int>(p.candidates_in->size(1));
  }
  if (p.candidates_out) {
    l.cand_out = p.candidates_out->ptr<int32_t>();
    l.cand_out_count = static_cast<int>(p.candidates_out->size(1));
    l.max_blocks = indexer_max_blocks(a);
    l.block_max = l.scores + T * l.max_context_len;
  }
  launch_indexer_topk(l, current_stream());
  launch_check("indexer_topk");
}

void kpool_topk(Tensor& out, const Tensor& q, const Tensor& weights, const Tensor& rows_cache,
                const Tensor& ape, const AttentionBatch& b, const KpoolArgs& a) {
  kpool_topk_check(out, q, weights, rows_cache, ape, a);
  const int H = a.num_heads, D = a.head_dim, P = a.pool, W = a.width();
  const int64_t T = q.size(0);
  const int keep = a.top_k / P;
  ATOM_CHECK(H <= kIndexerMaxHeads && D <= kIndexerMaxHeadDim && keep <= kIndexerMaxTopK &&
                 (H * D + H + 128 * (D + 1)) * 4 <= 200 * 1024,
             "kpool_topk: {} heads of {}, top {} pools: the CUDA kernels take up to {} heads of "
             "{} and top {}",
             H, D, keep, kIndexerMaxHeads, kIndexerMaxHeadDim, kIndexerMaxTopK);
  check_batch("kpool_topk", b);
  const int S = static_cast<int>(b.context_lens->numel());
  if (S == 0 || T == 0) return;
  const int64_t need = kpool_topk_workspace_size(T, S, a), pools = kpool_max_pools(a);
  ATOM_CHECK(b.workspace && b.workspace->dtype() == DType::kF32 && b.workspace->is_contiguous() &&
                 b.workspace->numel() >= need,
             "kpool_topk: needs an F32 workspace of {} elements (kpool_topk_workspace_size)", need);
  float* pooled = b.workspace->ptr<float>();
  IndexerLaunch l =
      indexer_launch("kpool_topk", q, weights, rows_cache, b, H, D, a.scale, a.weights_scale);
  l.top_k = keep;
  l.max_context_len = static_cast<int>(pools);
  l.pool = P;
  l.scores = pooled + S * pools * D;
  l.topk = reinterpret_cast<int32_t*>(l.scores + T * pools);
  launch_kpool_topk(l, ape.ptr<float>(), pooled, out.ptr<int32_t>(), W, a.tail, current_stream());
  launch_check("kpool_topk");
}

void layer_norm(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  check_rows("layer_norm", out, "out");
  check_rows("layer_norm", x, "x");
  const int64_t dim = x.size(1);
  ATOM_CHECK(
      out.shape() == x.shape() && w.numel() == dim && w.is_contiguous() &&
          (!b.defined() || (b.numel() == dim && b.dtype() == w.dtype() && b.is_contiguous())),
      "layer_norm: x {} out {} w {} b {}", x.str(), out.str(), w.str(), b.str());
  launch_layer_norm(mat_of(out, "layer_norm"), mat_of(x, "layer_norm"), w.data(),
                    b.defined() ? b.data() : nullptr, elem_of(w.dtype(), "layer_norm"), eps,
                    current_stream());
  launch_check("layer_norm");
}

}  // namespace atom::kernels::cuda
