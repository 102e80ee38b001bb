// DeepSeek-V2 and V2-Lite (transformers' modular_deepseek_v2.py): multi-head latent attention
// (layers/mla.h) with RoPE on complex pairs (interleaved), q LoRA unless q_lora_rank is null;
// the first first_k_dense_replace layers use a dense MLP, the others DeepseekV2Moe: softmax
// scores, top-k over all experts ("greedy") or over the topk_group groups with the best single
// score ("group_limited_greedy"), never renormalised (transformers ignores norm_topk_prob here),
// times routed_scaling_factor, beside n_shared_experts shared experts.
#include "models/deepseek.h"

namespace atom {

namespace {

bool deepseek_v2_interleave(const ModelConfig&) { return true; }  // view_as_complex pairs

std::unique_ptr<FeedForward> deepseek_v2_mlp(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                                             const std::string& prefix) {
  const ConfigFields& t = c.text;
  if (c.hidden_act != "silu") t.bad("hidden_act", "must be silu, got '" + c.hidden_act + "'");
  if (layer < t.get_int("first_k_dense_replace", 0))
    return std::make_unique<GatedMlp>(ctx, prefix, c.hidden_size, c.intermediate_size, c.mlp_bias);
  if (c.mlp_bias) t.bad("mlp_bias", "is not supported in mixture-of-experts layers");
  SparseMoeOptions o;
  o.router.scoring = kernels::RouterScoring::kSoftmax;
  const std::string method = t.get_string("topk_method", "greedy");
  if (method == "group_limited_greedy") {
    o.router.n_group = static_cast<int>(t.get_int("n_group"));
    o.router.topk_group = static_cast<int>(t.get_int("topk_group"));
    o.router.group_score = kernels::GroupScore::kMax;
  } else if (method != "greedy") {
    t.bad("topk_method", "must be 'greedy' or 'group_limited_greedy', got '" + method + "'");
  }
  o.router.renormalize = false;
  return deepseek_moe(ctx, c, prefix, o, /*default_experts=*/64, /*default_shared=*/2);
}

class DeepseekV2ForCausalLM
    : public DecoderOnlyLM<LlamaDecoderLayer<DeepseekAttention<deepseek_v2_interleave>,
                                             PerLayerMlp<deepseek_v2_mlp>>> {
 public:
  using DecoderOnlyLM::DecoderOnlyLM;
  std::vector<std::string> quantization_methods() const override {
    return fp8_quantization_methods();
  }
  WeightLoadSpec weight_load_spec() const override {
    return deepseek_weight_load_spec(*this, deepseek_num_experts(config(), 64), 2);
  }
  bool supports_data_parallel_attention() const override { return true; }
};

}  // namespace

ATOM_REGISTER_MODEL("DeepseekV2ForCausalLM", DeepseekV2ForCausalLM);

}  // namespace atom
