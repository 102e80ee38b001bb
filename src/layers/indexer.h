// The lightning indexer of DeepSeek sparse attention (transformers' DeepseekV32Indexer and
// GlmMoeDsaIndexer): for each new token it scores every visible context position and keeps the
// top index_topk, which multi-head latent attention then attends over (layers/mla.h):
//
//   q_I = wq_b(q_resid) [T, Hi, D]      k_I = k_norm(wk(x)) [T, D]   (k_norm: LayerNorm, eps 1e-6)
//   RoPE on the first qk_rope_head_dim channels of q_I and k_I (halves in V3.2, interleaved
//   pairs in GLM-5), with the model's rotary frequencies and attention factor
//   k_I written to the layer's indexer key cache (CacheKind::kIndexerKey)
//   score_j = Σ_h (weights_proj(x)_h · Hi^-0.5) · relu(D^-0.5 · q_I,h · k_I,j)   (fp32)
//   topk = the index_topk best visible positions (kernels::indexer_topk)
//
// Replicated on every tensor-parallel rank (each rank selects the same positions).
#pragma once

#include <string>

#include "layers/context.h"
#include "layers/linear.h"
#include "layers/rotary.h"

namespace atom {

struct IndexerOptions {
  int64_t hidden = 0;
  int64_t q_lora_rank = 0;
  int64_t num_heads = 0;  // index_n_heads
  int64_t head_dim = 0;   // index_head_dim
  int64_t rope_dim = 0;   // qk_rope_head_dim: RoPE on the first rope_dim channels
  int64_t top_k = 0;      // index_topk
  bool interleaved_rope = false;
  double norm_eps = 1e-6;  // k_norm
};

class SparseAttentionIndexer {
 public:
  // rotary: the attention's (its inverse frequencies over rope_dim and attention factor).
  SparseAttentionIndexer(LayerContext& ctx, const std::string& prefix, const IndexerOptions& o,
                         const RotaryEmbedding& rotary);
  // x [T, hidden] (the attention's input), q_resid [T, q_lora_rank] -> topk [T, index_topk] I32
  // (positions, -1 past a short context), into `topk` when given.
  Tensor forward(Step& step, const Tensor& x, const Tensor& q_resid, Tensor topk = Tensor());
  int64_t top_k() const { return o_.top_k; }

 private:
  LayerContext& ctx_;
  IndexerOptions o_;
  const RotaryEmbedding& rotary_;
  ReplicatedLinear wq_b_;          // q_lora_rank -> Hi D
  ReplicatedLinear wk_;            // hidden -> D
  ReplicatedLinear weights_proj_;  // hidden -> Hi
  Parameter* k_norm_weight_;
  Parameter* k_norm_bias_;
  int cache_index_;
};

}  // namespace atom
