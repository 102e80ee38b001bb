// DeepSeek-V3 (transformers' modular_deepseek_v3.py), also Kimi-K2's text model: DeepSeek-V2's
// multi-head latent attention with RoPE on interleaved pairs when rope_interleave (the default)
// or on halves; the first first_k_dense_replace layers use a dense MLP, the others
// DeepseekV3MoE: sigmoid scores plus e_score_correction_bias (the choice only), limited to the
// topk_group of n_group groups with the best top-2 sums, renormalised when norm_topk_prob, times
// routed_scaling_factor, beside n_shared_experts shared experts. The MTP layer a checkpoint
// carries at index num_hidden_layers is skipped by a plain load and is the drafter of
// speculative decoding (DeepSeekMTP, models/deepseek_mtp.h).
#include "models/deepseek.h"
#include "models/deepseek_mtp.h"
#include "models/moonvit.h"

namespace atom {

namespace {

bool deepseek_v3_interleave(const ModelConfig& c) {
  return c.text.get_bool("rope_interleave", true);
}

std::unique_ptr<FeedForward> deepseek_v3_mlp(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                                             const std::string& prefix) {
  const ConfigFields& t = c.text;
  if (c.hidden_act != "silu") t.bad("hidden_act", "must be silu, got '" + c.hidden_act + "'");
  if (layer < t.get_int("first_k_dense_replace", 3))
    return std::make_unique<GatedMlp>(ctx, prefix, c.hidden_size, c.intermediate_size, false);
  SparseMoeOptions o;
  o.router.scoring = kernels::RouterScoring::kSigmoid;
  o.router.n_group = static_cast<int>(t.get_int("n_group", 8));
  o.router.topk_group = static_cast<int>(t.get_int("topk_group", 4));
  o.router.group_score = kernels::GroupScore::kTop2Sum;
  o.router.renormalize = t.get_bool("norm_topk_prob", true);
  o.correction_bias = true;
  return deepseek_moe(ctx, c, prefix, o, /*default_experts=*/256, /*default_shared=*/1);
}

using DeepseekV3DecoderLayer =
    LlamaDecoderLayer<DeepseekAttention<deepseek_v3_interleave>, PerLayerMlp<deepseek_v3_mlp>>;

class DeepseekV3ForCausalLM : public DecoderOnlyLM<DeepseekV3DecoderLayer> {
 public:
  using DecoderOnlyLM::DecoderOnlyLM;
  std::vector<std::string> quantization_methods() const override {
    return fp8_quantization_methods();
  }
  WeightLoadSpec weight_load_spec() const override {
    return deepseek_weight_load_spec(*this, deepseek_num_experts(config(), 256), 1);
  }
  bool supports_data_parallel_attention() const override { return true; }
};

// Kimi-K2.5 / K2.6 (KimiK25ForConditionalGeneration; transformers'
// Kimi_K25ForConditionalGeneration): this text model under language_model.*, the MoonViT vision
// tower (vision_tower.*) and its patchmerger projector (mm_projector.*), whose features replace the
// prompt's image placeholder tokens (Batch::input_embeds).
class KimiK25ForConditionalGeneration : public DeepseekV3ForCausalLM {
 public:
  KimiK25ForConditionalGeneration(const ModelConfig& c, const ModelOptions& o)
      : DeepseekV3ForCausalLM(c, o), vision_(moonvit_on_leader(ctx(), c)) {}
  VisionEncoder* vision_encoder() override { return vision_.get(); }
  WeightLoadSpec weight_load_spec() const override {
    WeightLoadSpec s = DeepseekV3ForCausalLM::weight_load_spec();
    s.weights_mapping.prefix.push_back({"language_model.model.", "model."});
    s.weights_mapping.prefix.push_back({"language_model.lm_head.", "lm_head."});
    // transformers 5.17's save_pretrained writes the patch embedding under the encoder.
    s.weights_mapping.prefix.push_back(
        {"vision_tower.encoder.patch_embed.", "vision_tower.patch_embed."});
    return s;
  }

 private:
  std::unique_ptr<MoonVit> vision_;  // on the group's leader rank only
};

}  // namespace

// The checkpoint's MTP layers as a drafter (models/deepseek_mtp.h).
using DeepseekV3MTP = DeepSeekMTP<DeepseekV3DecoderLayer, 256, 1>;

ATOM_REGISTER_MODEL("DeepseekV3ForCausalLM", DeepseekV3ForCausalLM);
ATOM_REGISTER_MODEL("KimiK25ForConditionalGeneration", KimiK25ForConditionalGeneration);
ATOM_REGISTER_DRAFTER("DeepseekV3ForCausalLM", DeepseekV3MTP);

}  // namespace atom
