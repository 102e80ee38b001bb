// Qwen3.5 and Qwen3.5-MoE, text only (transformers' modular_qwen3_5.py, modular_qwen3_5_moe.py):
// Qwen3-Next's layers with Qwen3.5's separate linear-attention projections (in_proj_qkv,
// in_proj_z, in_proj_b, in_proj_a); dense SwiGLU on every layer (Qwen3.5) or, on every layer, a
// softmax top-k mixture of experts always renormalised with a sigmoid-gated shared expert
// (Qwen3.5-MoE, experts stored stacked or per expert). The checkpoint of the multimodal wrapper
// keeps the language model under model.language_model.*; the vision tower (model.visual.*) and
// MTP tensors (mtp.*) are skipped unread. For text, the interleaved M-RoPE of these models has
// every position stream equal, which is plain partial NeoX RoPE.
#include "models/qwen3_next.h"

namespace atom {

std::unique_ptr<FeedForward> qwen3_5_mlp(LayerContext& ctx, const ModelConfig& c, int64_t,
                                         const std::string& prefix) {
  return std::make_unique<GatedMlp>(ctx, prefix, c.hidden_size, c.intermediate_size, false);
}

std::unique_ptr<FeedForward> qwen3_5_moe_mlp(LayerContext& ctx, const ModelConfig& c, int64_t,
                                             const std::string& prefix) {
  return qwen3_next_moe(ctx, c, prefix, /*renormalize=*/true);  // Qwen3VLMoeTextTopKRouter
}

WeightLoadSpec qwen3_5_weight_load_spec(WeightLoadSpec s, int64_t num_experts) {
  s = qwen3_next_weight_load_spec(std::move(s), num_experts);
  for (auto& m : gated_delta_net_packed_modules()) s.packed_modules.push_back(m);
  s.weights_mapping.prefix.push_back({"model.visual.", std::nullopt});
  s.weights_mapping.prefix.push_back({"model.language_model.", "model."});
  return s;
}

namespace {

template <auto Mlp>
class Qwen3_5TextOnly : public DecoderOnlyLM<Qwen3NextDecoderLayer<PerLayerMlp<Mlp>, false>> {
 public:
  using Base = DecoderOnlyLM<Qwen3NextDecoderLayer<PerLayerMlp<Mlp>, false>>;
  using Base::Base;
  WeightLoadSpec weight_load_spec() const override {
    return qwen3_5_weight_load_spec(Model::weight_load_spec(),
                                    this->config().text.get_int("num_experts", 0));
  }
};

using Qwen3_5ForConditionalGeneration = Qwen3_5TextOnly<qwen3_5_mlp>;
using Qwen3_5MoeForConditionalGeneration = Qwen3_5TextOnly<qwen3_5_moe_mlp>;

}  // namespace

ATOM_REGISTER_MODEL_SUPPORTING("Qwen3_5ForConditionalGeneration", Qwen3_5ForConditionalGeneration,
                               qwen3_next_support());
ATOM_REGISTER_MODEL_SUPPORTING("Qwen3_5MoeForConditionalGeneration",
                               Qwen3_5MoeForConditionalGeneration, qwen3_next_support());
ATOM_REGISTER_MODEL_SUPPORTING("Qwen3_5ForCausalLM", Qwen3_5ForConditionalGeneration,
                               qwen3_next_support());
ATOM_REGISTER_MODEL_SUPPORTING("Qwen3_5MoeForCausalLM", Qwen3_5MoeForConditionalGeneration,
                               qwen3_next_support());

}  // namespace atom
