// DeepSeek-V3.2 (transformers' modular_deepseek_v32.py): DeepSeek-V3's multi-head latent
// attention (q LoRA, RoPE on interleaved pairs) over the positions its lightning indexer selects
// (layers/indexer.h: index_topk per query, RoPE on halves), and V3's router; a layer's MLP is
// dense or a mixture of experts as mlp_layer_types says (default: first_k_dense_replace dense
// layers). The MTP layer past num_hidden_layers is skipped.
#include "models/deepseek.h"

namespace atom {

IndexerOptions deepseek_indexer_options(const ModelConfig& c, const MlaOptions& mla,
                                        bool interleaved_rope) {
  const ConfigFields& t = c.text;
  if (mla.q_lora_rank < 1) t.bad("q_lora_rank", "must be set: the indexer reads the q LoRA");
  IndexerOptions o;
  o.hidden = c.hidden_size;
  o.q_lora_rank = mla.q_lora_rank;
  o.num_heads = t.get_int("index_n_heads", 64);
  o.head_dim = t.get_int("index_head_dim", 128);
  o.top_k = t.get_int("index_topk", 2048);
  if (o.num_heads < 1) t.bad("index_n_heads", "must be positive");
  if (o.head_dim < mla.qk_rope_head_dim)
    t.bad("index_head_dim", "must be at least qk_rope_head_dim");
  if (o.top_k < 1) t.bad("index_topk", "must be positive");
  o.rope_dim = mla.qk_rope_head_dim;
  o.interleaved_rope = interleaved_rope;
  return o;
}

// mlp_layer_types ("dense" / "sparse" per layer), else first_k_dense_replace dense layers.
bool deepseek_sparse_mlp(const ModelConfig& c, int64_t layer, int64_t default_dense) {
  const ConfigFields& t = c.text;
  if (!t.has("mlp_layer_types")) return layer >= t.get_int("first_k_dense_replace", default_dense);
  const auto types = t.get_string_list("mlp_layer_types");
  if (static_cast<int64_t>(types.size()) != c.num_hidden_layers)
    t.bad("mlp_layer_types",
          fmt::format("has {} entries for {} layers", types.size(), c.num_hidden_layers));
  const std::string& k = types.at(static_cast<size_t>(layer));
  if (k != "dense" && k != "sparse")
    t.bad("mlp_layer_types", "entries must be 'dense' or 'sparse', got '" + k + "'");
  return k == "sparse";
}

// DeepSeek-V3's MoE block (sigmoid, correction bias, top-2-sum groups) or a dense MLP.
std::unique_ptr<FeedForward> deepseek_v32_family_mlp(LayerContext& ctx, const ModelConfig& c,
                                                     int64_t layer, const std::string& prefix,
                                                     int default_groups, int default_keep,
                                                     float swiglu_limit) {
  const ConfigFields& t = c.text;
  if (c.hidden_act != "silu") t.bad("hidden_act", "must be silu, got '" + c.hidden_act + "'");
  if (!deepseek_sparse_mlp(c, layer, 3))
    return std::make_unique<GatedMlp>(ctx, prefix, c.hidden_size, c.intermediate_size, false,
                                      /*reduce_results=*/true,
                                      kernels::Glu::silu_clamped(swiglu_limit));
  SparseMoeOptions o;
  o.experts.activation = kernels::Glu::silu_clamped(swiglu_limit);
  o.router.scoring = kernels::RouterScoring::kSigmoid;
  o.router.n_group = static_cast<int>(t.get_int("n_group", default_groups));
  o.router.topk_group = static_cast<int>(t.get_int("topk_group", default_keep));
  o.router.group_score = kernels::GroupScore::kTop2Sum;
  o.router.renormalize = t.get_bool("norm_topk_prob", true);
  o.correction_bias = true;
  return deepseek_moe(ctx, c, prefix, o, /*default_experts=*/256, /*default_shared=*/1);
}

namespace {

class DeepseekV32Attention {
 public:
  DeepseekV32Attention(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                       const std::string& prefix)
      : DeepseekV32Attention(ctx, c, prefix, deepseek_mla_options(c, /*interleaved=*/true)) {}
  DeepseekV32Attention(LayerContext& ctx, const ModelConfig& c, const std::string& prefix,
                       const MlaOptions& mla)
      : ctx_(ctx),
        mla_(attention_context(ctx), prefix, mla),
        indexer_(attention_context(ctx), prefix + ".indexer",
                 deepseek_indexer_options(c, mla, /*interleaved_rope=*/false), mla_.rotary()) {}

  // With data-parallel attention, on this rank's sequences (their indexer keys in its cache).
  Tensor forward(Step& step, const Tensor& x) {
    return data_parallel_attention(step, ctx_, x, [this](Step& s, const Tensor& xs) {
      auto p = mla_.project(s, xs);  // q, q_resid; (c_kv | k_pe) cached
      Tensor topk = indexer_.forward(s, xs, p.q_resid);
      return mla_.attend(s, p, topk);
    });
  }

 private:
  LayerContext& ctx_;
  MultiHeadLatentAttention mla_;
  SparseAttentionIndexer indexer_;
};

std::unique_ptr<FeedForward> deepseek_v32_mlp(LayerContext& ctx, const ModelConfig& c,
                                              int64_t layer, const std::string& prefix) {
  return deepseek_v32_family_mlp(ctx, c, layer, prefix, 8, 4);
}

class DeepseekV32ForCausalLM
    : public DecoderOnlyLM<LlamaDecoderLayer<DeepseekV32Attention, PerLayerMlp<deepseek_v32_mlp>>> {
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
ATOM_REGISTER_MODEL_SUPPORTING("DeepseekV32ForCausalLM", DeepseekV32ForCausalLM,
                               ModelSupport{.layer_types = {"deepseek_sparse_attention"}});

}  // namespace atom
