// Qwen3-Next (transformers' modular_qwen3_next.py) and the pieces Qwen3.5 reuses: a hybrid of
// Gated DeltaNet linear attention (layers/gated_delta_net.h) and gated full attention, every
// RMSNorm zero-centred (1 + w) but the gated one, and partial RoPE.
#pragma once

#include <memory>
#include <string>

#include "layers/gated_delta_net.h"
#include "models/llama.h"

namespace atom {

// Full attention with a sigmoid output gate: q_proj yields per head [query | gate] (stored as
// all queries, then all gates), per-head q/k norms (1 + w), partial NeoX RoPE, and
// o_proj(attn · sigmoid(gate)).
class Qwen3NextAttention {
 public:
  Qwen3NextAttention(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                     const std::string& prefix);
  Tensor forward(Step& step, const Tensor& x);

 private:
  GroupedColumnParallelLinear q_proj_;    // hidden -> [Hq * D queries | Hq * D gates] on this rank
  KVHeadParallelLinear k_proj_, v_proj_;  // hidden -> Hk * D (kv heads replicated past Hk ranks)
  RowParallelLinear o_proj_;              // Hq * D -> hidden
  RMSNorm q_norm_, k_norm_;               // [head_dim], (1 + w)
  RotaryEmbedding rotary_;
  Attention attn_;
};

// The gated delta net of a Qwen3-Next / Qwen3.5 config (linear_* fields).
GatedDeltaNetOptions qwen3_next_linear_attention_options(const ModelConfig& c,
                                                         bool grouped_projections);

// Whether layer `layer` is "linear_attention" (else "full_attention"), by layer_types.
bool qwen3_next_is_linear_attention(const ModelConfig& c, int64_t layer);
// What the hybrids implement: gated delta net and full attention layers, as layer_types says.
inline ModelSupport qwen3_next_support() {
  ModelSupport s;
  s.layer_types = {"linear_attention", "full_attention"};
  return s;
}

// input_layernorm -> linear_attn (Gated DeltaNet) or self_attn (gated attention), by
// layer_types -> post_attention_layernorm -> mlp, every norm (1 + w). Mlp is built as
// Mlp(ctx, config, layer, prefix + ".mlp").
template <class Mlp, bool GroupedProjections>
class Qwen3NextDecoderLayer {
 public:
  static constexpr kernels::RmsNormKind kNorm = kernels::RmsNormKind::kGemma;
  using State = NoLayerState;
  static State begin_step(Step&, const ModelConfig&) { return {}; }

  Qwen3NextDecoderLayer(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                        const std::string& prefix)
      : Qwen3NextDecoderLayer(ctx, c, layer, prefix, qwen3_next_is_linear_attention(c, layer)) {}
  // A layer of the given type whatever layer_types says: the MTP layers are full attention.
  Qwen3NextDecoderLayer(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                        const std::string& prefix, bool linear_attention)
      : input_layernorm_(ctx, prefix + ".input_layernorm", c.hidden_size, c.rms_norm_eps, kNorm),
        post_attention_layernorm_(ctx, prefix + ".post_attention_layernorm", c.hidden_size,
                                  c.rms_norm_eps, kNorm),
        mlp_(ctx, c, layer, prefix + ".mlp") {
    if (linear_attention)
      linear_attn_ = std::make_unique<GatedDeltaNet>(
          ctx, prefix + ".linear_attn", qwen3_next_linear_attention_options(c, GroupedProjections));
    else
      self_attn_ = std::make_unique<Qwen3NextAttention>(ctx, c, layer, prefix + ".self_attn");
  }

  // As LlamaDecoderLayer::forward: residual updated in place, this layer's output into `out`.
  void forward(Step& step, const Tensor& h, Tensor& residual, const Tensor& out, State&) {
    Tensor x = h.defined() ? input_layernorm_.forward(step, h, residual)
                           : input_layernorm_.forward(step, residual);
    Tensor a = linear_attn_ ? linear_attn_->forward(step, x) : self_attn_->forward(step, x);
    x = post_attention_layernorm_.forward(step, a, residual);
    mlp_.forward(step, x, out);
  }

 private:
  RMSNorm input_layernorm_, post_attention_layernorm_;
  std::unique_ptr<GatedDeltaNet> linear_attn_;
  std::unique_ptr<Qwen3NextAttention> self_attn_;
  Mlp mlp_;
};

// Qwen3-Next's sparse block: softmax top-k (renormalised when `renormalize`) plus the shared
// expert scaled by sigmoid(shared_expert_gate(x)).
std::unique_ptr<FeedForward> qwen3_next_moe(LayerContext& ctx, const ModelConfig& c,
                                            const std::string& prefix, bool renormalize);

// Qwen3-Next's feed-forward of layer `layer`: the sparse block, or a dense MLP in mlp_only_layers
// and off the decoder_sparse_step.
std::unique_ptr<FeedForward> qwen3_next_mlp(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                                            const std::string& prefix);

// Qwen3.5 (models/qwen3_5.cpp): the dense SwiGLU of every layer, the MoE variant's sparse block,
// and the checkpoint names (the language model under model.language_model.*, the vision tower
// skipped, Qwen3.5's separate linear-attention projections).
std::unique_ptr<FeedForward> qwen3_5_mlp(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                                         const std::string& prefix);
std::unique_ptr<FeedForward> qwen3_5_moe_mlp(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                                             const std::string& prefix);
WeightLoadSpec qwen3_5_weight_load_spec(WeightLoadSpec s, int64_t num_experts);

// Checkpoint names of the Qwen3-Next family: q/k/v projections stay apart (q_proj carries the
// gate), MTP tensors (mtp.*) are not wanted, experts per expert or stacked.
WeightLoadSpec qwen3_next_weight_load_spec(WeightLoadSpec s, int64_t num_experts);

}  // namespace atom
