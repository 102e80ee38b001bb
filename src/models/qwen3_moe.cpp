// Qwen3-MoE (transformers' modular_qwen3_moe.py): Qwen3's attention; a layer's MLP is a softmax
// top-k mixture of experts (Qwen3MoeSparseMoeBlock) unless the layer is in mlp_only_layers or off
// the decoder_sparse_step, where it is a dense MLP of intermediate_size. No shared experts.
#include "layers/moe.h"
#include "models/qwen3.h"

namespace atom {

namespace {

// transformers' Qwen3MoeConfig maps num_experts to num_local_experts, and writes the latter.
int64_t qwen3_moe_num_experts(const ModelConfig& c) {
  return c.text.has("num_experts") ? c.text.get_int("num_experts")
                                   : c.text.get_int("num_local_experts", 0);
}

bool qwen3_moe_is_sparse(const ModelConfig& c, int64_t layer) {
  for (const int64_t i : c.text.has("mlp_only_layers") ? c.text.get_int_list("mlp_only_layers")
                                                       : std::vector<int64_t>{})
    if (i == layer) return false;
  const int64_t step = c.text.get_int("decoder_sparse_step", 1);
  if (step < 1) c.text.bad("decoder_sparse_step", "must be at least 1");
  return qwen3_moe_num_experts(c) > 0 && (layer + 1) % step == 0;
}

std::unique_ptr<FeedForward> qwen3_moe_mlp(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                                           const std::string& prefix) {
  if (!qwen3_moe_is_sparse(c, layer))
    return std::make_unique<GatedMlp>(ctx, prefix, c.hidden_size, c.intermediate_size, false);
  SparseMoeOptions o;
  o.hidden = c.hidden_size;
  o.num_experts = qwen3_moe_num_experts(c);
  o.moe_intermediate = c.text.get_int("moe_intermediate_size");
  o.router.scoring = kernels::RouterScoring::kSoftmax;
  o.router.top_k = static_cast<int>(c.text.get_int("num_experts_per_tok"));
  if (o.router.top_k < 1 || o.router.top_k > o.num_experts)
    c.text.bad("num_experts_per_tok", fmt::format("must be in [1, {}]", o.num_experts));
  o.router.renormalize = c.text.get_bool("norm_topk_prob", false);
  return std::make_unique<SparseMoeBlock>(ctx, prefix, o);
}

class Qwen3MoeForCausalLM
    : public DecoderOnlyLM<LlamaDecoderLayer<Qwen3Attention, PerLayerMlp<qwen3_moe_mlp>>> {
 public:
  using DecoderOnlyLM::DecoderOnlyLM;
  std::vector<std::string> quantization_methods() const override {
    return fp8_quantization_methods();
  }

  WeightLoadSpec weight_load_spec() const override {
    WeightLoadSpec s = Model::weight_load_spec();
    s.expert_mapping = fused_moe_expert_mapping("gate_proj", "down_proj", "up_proj",
                                                qwen3_moe_num_experts(config()));
    for (auto& m : fused_moe_stacked_mapping()) s.expert_mapping.push_back(m);
    return s;
  }
};

}  // namespace

ATOM_REGISTER_MODEL_SUPPORTING("Qwen3MoeForCausalLM", Qwen3MoeForCausalLM, llama_support());

}  // namespace atom
