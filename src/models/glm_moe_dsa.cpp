// GLM-5 (transformers' modular_glm_moe_dsa.py): DeepSeek-V3.2's sparse multi-head latent
// attention with RoPE on interleaved pairs in the indexer too, where only the "full" layers of
// indexer_types run an indexer and each "shared" layer reuses the selection of the last full
// layer before it (the model hands it from layer to layer); V3's router (defaults: one group);
// mlp_layer_types / first_k_dense_replace dense layers. The MTP layer is skipped.
#include "models/deepseek.h"

namespace atom {

namespace {

class GlmMoeDsaAttention {
 public:
  // What the layers hand on: the last full layer's selection [T, index_topk], made before the
  // first layer so that it outlives each layer's scratch.
  struct State {
    Tensor topk;
    // Pipeline stages hand the selection on: a stage may begin with a shared layer.
    std::vector<Tensor> to_stage() const { return {topk}; }
    void from_stage(const std::vector<Tensor>& t) {
      ATOM_CHECK(t.size() == 1 && t[0].shape() == topk.shape() && t[0].dtype() == topk.dtype(),
                 "GLM-5: the previous pipeline stage handed on {} tensors, not the selection {}",
                 t.size(), topk.str());
      topk = t[0];  // the step's own copy (Step::pp_in)
    }
  };
  static State begin_step(Step& step, const ModelConfig& c) {
    return {step.empty({step.batch.num_tokens(), c.text.get_int("index_topk", 2048)}, DType::kI32)};
  }

  GlmMoeDsaAttention(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                     const std::string& prefix)
      : GlmMoeDsaAttention(ctx, c, layer, prefix, deepseek_mla_options(c, /*interleaved=*/true)) {}

  GlmMoeDsaAttention(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                     const std::string& prefix, const MlaOptions& mla)
      : ctx_(ctx), mla_(attention_context(ctx), prefix, mla) {
    if (dsa_indexer_types(c).at(static_cast<size_t>(layer)) == "full")
      indexer_ = std::make_unique<SparseAttentionIndexer>(
          attention_context(ctx), prefix + ".indexer",
          deepseek_indexer_options(c, mla, /*interleaved_rope=*/true), mla_.rotary());
  }

  // With data-parallel attention, on this rank's sequences: their selection in the first rows of
  // the state (the same rows in every layer of the step).
  Tensor forward(Step& step, const Tensor& x, State& state) {
    return data_parallel_attention(step, ctx_, x, [&](Step& s, const Tensor& xs) {
      Tensor topk = state.topk.narrow(0, 0, xs.size(0));
      auto p = mla_.project(s, xs);
      if (indexer_) indexer_->forward(s, xs, p.q_resid, topk);  // else: the last full one's
      return mla_.attend(s, p, topk);
    });
  }

 private:
  LayerContext& ctx_;
  MultiHeadLatentAttention mla_;
  std::unique_ptr<SparseAttentionIndexer> indexer_;  // "full" layers only
};

std::unique_ptr<FeedForward> glm_moe_dsa_mlp(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                                             const std::string& prefix) {
  return deepseek_v32_family_mlp(ctx, c, layer, prefix, 1, 1);
}

class GlmMoeDsaForCausalLM
    : public DecoderOnlyLM<LlamaDecoderLayer<GlmMoeDsaAttention, PerLayerMlp<glm_moe_dsa_mlp>>> {
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

}  // namespace

// Every layer is DeepSeek sparse attention (the indexer picks the keys).
ATOM_REGISTER_MODEL_SUPPORTING("GlmMoeDsaForCausalLM", GlmMoeDsaForCausalLM,
                               ModelSupport{.layer_types = {"deepseek_sparse_attention"}});

}  // namespace atom
