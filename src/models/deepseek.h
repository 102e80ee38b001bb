// What the DeepSeek family (transformers' deepseek_v2, deepseek_v3; deepseek_v32 and
// glm_moe_dsa build on them) shares: multi-head latent attention read from the config, the
// DeepSeek MoE block beside a dense first_k_dense_replace prefix, and how checkpoints map.
#pragma once

#include <memory>
#include <string>

#include "layers/dp_attention.h"
#include "layers/indexer.h"
#include "layers/mla.h"
#include "layers/moe.h"
#include "models/llama.h"

namespace atom {

// The config's MLA fields, with the transformers class defaults (`q_lora_rank` null: a plain
// q_proj; absent: 1536), the softmax scale with YaRN's mscale² (mla_softmax_scale) and RoPE over
// qk_rope_head_dim channels.
MlaOptions deepseek_mla_options(const ModelConfig& c, bool interleaved_rope);

// n_routed_experts (DeepSeek's name; transformers also maps num_experts / num_local_experts).
int64_t deepseek_num_experts(const ModelConfig& c, int64_t fallback);

// The DeepSeek MoE block (routed experts of moe_intermediate_size, n_shared_experts shared ones
// beside them, one reduction) with the family's router in o.router; the sizes are read here.
std::unique_ptr<FeedForward> deepseek_moe(LayerContext& ctx, const ModelConfig& c,
                                          const std::string& prefix, SparseMoeOptions o,
                                          int64_t default_experts, int64_t default_shared);

// How a DeepSeek checkpoint maps: no fused q/k/v (q_proj is MLA's own), gate/up fused, routed
// experts per expert or stacked, shared experts as slots of the fused layer when the model loads
// them so; MTP layers past num_hidden_layers are skipped by the loader.
// shared_fusable false: the shared experts never load as an expert slot (a latent MoE's).
WeightLoadSpec deepseek_weight_load_spec(const Model& m, int64_t num_experts,
                                         int64_t default_shared, bool shared_fusable = true);

// DeepSeek sparse attention (V3.2, GLM-5): the indexer's fields (index_n_heads, index_head_dim,
// index_topk; its RoPE over the attention's qk_rope_head_dim channels), which need q LoRA.
IndexerOptions deepseek_indexer_options(const ModelConfig& c, const MlaOptions& mla,
                                        bool interleaved_rope);

// Which layers run their own sparse-attention indexer ("full") and which reuse the last full
// layer's selection ("shared") (GLM-5, GLM-5.3): indexer_types, else index_topk_pattern ("FSS..."
// or a list), else index_topk_freq and index_skip_topk_offset, as transformers derives them;
// the first layer must be full.
std::vector<std::string> dsa_indexer_types(const ModelConfig& c);

// The V3.2 family's MLP of a layer: dense as mlp_layer_types says (else the first
// first_k_dense_replace layers), otherwise DeepSeek-V3's MoE (sigmoid, correction bias, top-2-sum
// groups with these defaults). swiglu_limit > 0: every SwiGLU (dense, shared, routed) clamped
// (GLM-5.3).
std::unique_ptr<FeedForward> deepseek_v32_family_mlp(LayerContext& ctx, const ModelConfig& c,
                                                     int64_t layer, const std::string& prefix,
                                                     int default_groups, int default_keep,
                                                     float swiglu_limit = 0.0f);

// The spec's DeepSeek fusion switches, read from the environment (default on, as measured faster;
// "0" turns one off): ATOM_ENABLE_DS_INPUT_RMSNORM_QUANT_FUSION, input_layernorm
// written as the FP8 input that q_proj / q_a_proj and kv_a_proj_with_mqa share;
// ATOM_ENABLE_DS_QKNORM_QUANT_FUSION, q_a_layernorm written as q_b_proj's.
bool deepseek_fused_input_norm_quant();
bool deepseek_fused_q_norm_quant();

// The self-attention of a DeepSeek decoder layer: MLA, with RoPE on interleaved pairs where
// Interleave(config) says so. With data-parallel attention (the models that use it say
// supports_data_parallel_attention) every rank holds every head and attends for its own
// sequences (layers/dp_attention.h).
template <bool (*Interleave)(const ModelConfig&)>
class DeepseekAttention {
 public:
  DeepseekAttention(LayerContext& ctx, const ModelConfig& c, int64_t, const std::string& prefix)
      : ctx_(ctx),
        mla_(attention_context(ctx), prefix, deepseek_mla_options(c, Interleave(c))),
        fuse_input_quant_(deepseek_fused_input_norm_quant() && !ctx.data_parallel_attention) {
    mla_.set_fused_q_norm_quant(deepseek_fused_q_norm_quant());
  }
  Tensor forward(Step& step, const LinearInput& x) {
    if (x.quantised()) return mla_.forward(step, x);  // no data-parallel attention (input_linear)
    return data_parallel_attention(
        step, ctx_, x.x, [this](Step& s, const Tensor& xs) { return mla_.forward(s, xs); });
  }
  // The product that reads x, for input_layernorm to write its quantised input
  // (ATOM_ENABLE_DS_INPUT_RMSNORM_QUANT_FUSION; not under data-parallel attention, which gathers
  // 16-bit rows); nullptr when off or when MLA's products quantise differently.
  const LinearBase* input_linear() const {
    return fuse_input_quant_ ? mla_.input_linear() : nullptr;
  }

 private:
  LayerContext& ctx_;
  MultiHeadLatentAttention mla_;
  bool fuse_input_quant_;
};

}  // namespace atom
