// Mixtral (transformers' modular_mixtral.py): Llama's attention with config.sliding_window on
// every layer, and in every layer a softmax top-k mixture of experts whose choice is always
// renormalised. Hub checkpoints name the block block_sparse_moe and the experts' projections
// w1 (gate), w3 (up), w2 (down).
#include "layers/moe.h"
#include "models/llama.h"

namespace atom {

namespace {

int mixtral_layer_window(const ModelConfig& c, int64_t layer) {
  if (!c.layer_types.empty()) return llama_layer_window(c, layer);
  return c.sliding_window ? static_cast<int>(*c.sliding_window) : 0;
}

class MixtralAttention : public LlamaAttention {
 public:
  MixtralAttention(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                   const std::string& prefix)
      : LlamaAttention(ctx, c, layer, prefix, mixtral_layer_window(c, layer)) {}
};

int64_t mixtral_num_experts(const ModelConfig& c) {
  const int64_t e = c.text.get_int("num_local_experts");
  if (e < 1) c.text.bad("num_local_experts", "must be positive");
  return e;
}

std::unique_ptr<FeedForward> mixtral_moe(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                                         const std::string& prefix) {
  SparseMoeOptions o;
  o.hidden = c.hidden_size;
  o.num_experts = mixtral_num_experts(c);
  o.moe_intermediate = c.intermediate_size;
  o.router.scoring = kernels::RouterScoring::kSoftmax;
  o.router.top_k = static_cast<int>(c.text.get_int("num_experts_per_tok"));
  if (o.router.top_k < 1 || o.router.top_k > o.num_experts)
    c.text.bad("num_experts_per_tok", fmt::format("must be in [1, {}]", o.num_experts));
  o.router.renormalize = true;
  return std::make_unique<SparseMoeBlock>(ctx, prefix, o);
}

class MixtralForCausalLM
    : public DecoderOnlyLM<LlamaDecoderLayer<MixtralAttention, PerLayerMlp<mixtral_moe>>> {
 public:
  using DecoderOnlyLM::DecoderOnlyLM;
  std::vector<std::string> quantization_methods() const override {
    return fp8_quantization_methods();
  }

  WeightLoadSpec weight_load_spec() const override {
    WeightLoadSpec s = Model::weight_load_spec();
    // transformers v5 calls the block mlp; hub checkpoints, block_sparse_moe.
    s.weights_mapping.substr.push_back({".block_sparse_moe.", ".mlp."});
    s.expert_mapping = fused_moe_expert_mapping("w1", "w2", "w3", mixtral_num_experts(config()));
    for (auto& m : fused_moe_expert_mapping("gate_proj", "down_proj", "up_proj",
                                            mixtral_num_experts(config())))
      s.expert_mapping.push_back(m);
    for (auto& m : fused_moe_stacked_mapping()) s.expert_mapping.push_back(m);
    return s;
  }
};

}  // namespace

ATOM_REGISTER_MODEL_SUPPORTING("MixtralForCausalLM", MixtralForCausalLM, llama_support());

}  // namespace atom
