#include "layers/indexer.h"

#include <cmath>

#include "core/error.h"
#include "kernels/layer_norm.h"
#include "kernels/linear.h"
#include "kernels/mla.h"
#include "kernels/rope.h"

namespace atom {

namespace {
const IndexerOptions& checked(const std::string& prefix, const IndexerOptions& o) {
  if (o.num_heads < 1 || o.head_dim < 1 || o.top_k < 1 || o.q_lora_rank < 1)
    fail("{}: the indexer needs index_n_heads, index_head_dim, index_topk and q_lora_rank "
         "(got {}, {}, {}, {})",
         prefix, o.num_heads, o.head_dim, o.top_k, o.q_lora_rank);
  if (o.rope_dim > o.head_dim)
    fail("{}: qk_rope_head_dim ({}) is larger than index_head_dim ({})", prefix, o.rope_dim,
         o.head_dim);
  return o;
}
}  // namespace

SparseAttentionIndexer::SparseAttentionIndexer(LayerContext& ctx, const std::string& prefix,
                                               const IndexerOptions& o,
                                               const RotaryEmbedding& rotary)
    : ctx_(ctx),
      o_(checked(prefix, o)),
      rotary_(rotary),
      wq_b_(ctx, prefix + ".wq_b", o.q_lora_rank, o.num_heads * o.head_dim, false),
      wk_(ctx, prefix + ".wk", o.hidden, o.head_dim, false),
      // Kept in full precision by the checkpoints (read densely below).
      weights_proj_(ctx, prefix + ".weights_proj", o.hidden, o.num_heads, false,
                    LinearStorage::kUnquantized) {
  k_norm_weight_ =
      &ctx.params.add(prefix + ".k_norm.weight", ctx.param_tensor({o.head_dim}, ctx.weight_dtype));
  k_norm_bias_ =
      &ctx.params.add(prefix + ".k_norm.bias", ctx.param_tensor({o.head_dim}, ctx.weight_dtype));
  ATOM_CHECK(rotary.rot_dim() == o.rope_dim, "{}: RoPE over {} channels, expected {}", prefix,
             rotary.rot_dim(), o.rope_dim);
  ATOM_CHECK(ctx.cache_specs, "{}: layer context collects no cache specs", prefix);
  cache_index_ = static_cast<int>(ctx.cache_specs->size());
  ctx.cache_specs->push_back(CacheSpec::indexer_key(static_cast<int>(o.head_dim), ctx.act_dtype));
}

Tensor SparseAttentionIndexer::forward(Step& step, const Tensor& x, const Tensor& q_resid,
                                       Tensor topk) {
  ATOM_CHECK(step.kv, "the sparse-attention indexer needs a KV cache");
  const Batch& b = step.batch;
  const int64_t T = x.size(0);
  Tensor q = wq_b_.forward(step, q_resid);  // [T, Hi D]
  Tensor k = wk_.forward(step, x);          // [T, D]
  kernels::layer_norm(k, k, k_norm_weight_->data(), k_norm_bias_->data(),
                      static_cast<float>(o_.norm_eps));
  kernels::RopeArgs r;
  r.head_dim = static_cast<int>(o_.head_dim);
  r.rot_dim = static_cast<int>(o_.rope_dim);
  r.scale = rotary_.scale();
  r.interleaved = o_.interleaved_rope;
  kernels::rope(q, k, b.dev.positions, rotary_.inv_freq(), r);
  Tensor& cache = step.kv->plane(static_cast<size_t>(cache_index_), CacheKind::kIndexerKey);
  kernels::cache_rows_write(cache, k, b.dev.slot_mapping);
  Tensor weights = step.empty({T, o_.num_heads}, DType::kF32);
  kernels::linear(weights, x, weights_proj_.weight().data());
  if (!topk.defined()) topk = step.empty({T, o_.top_k}, DType::kI32);
  kernels::IndexerArgs a;
  a.num_heads = static_cast<int>(o_.num_heads);
  a.head_dim = static_cast<int>(o_.head_dim);
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(o_.head_dim)));
  a.weights_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(o_.num_heads)));
  a.top_k = static_cast<int>(o_.top_k);
  a.max_query_len = b.max_query_len;
  a.max_context_len = b.max_context_len;
  kernels::AttentionBatch ab{&b.dev.query_start, &b.dev.context_lens, &b.dev.page_indptr,
                             &b.dev.page_indices};
  Tensor workspace;
  const int64_t ws = kernels::indexer_topk_workspace_size(ctx_.device, T, a);
  if (ws > 0) {
    workspace = step.empty({ws}, DType::kF32);
    ab.workspace = &workspace;
  }
  kernels::indexer_topk(topk, q, weights, cache, ab, a);
  return topk;
}

}  // namespace atom
