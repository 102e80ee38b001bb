// GLM-4.5 / 4.6 / 4.7 and GLM-4.5-Air (transformers' modular_glm4_moe.py): attention with q/k/v
// bias (none on o_proj), optional per-head q/k RMSNorm and RoPE over the first
// partial_rotary_factor of each head; the first first_k_dense_replace layers use a dense MLP, the
// others a mixture of experts routed by sigmoid scores plus e_score_correction_bias (the choice
// only), group-limited (n_group, topk_group), renormalised and scaled by routed_scaling_factor,
// beside shared experts of n_shared_experts * moe_intermediate_size. The MTP layer at index
// num_hidden_layers is skipped by a plain load.
#include "layers/moe.h"
#include "models/llama.h"

namespace atom {

namespace {

class Glm4MoeAttention {
 public:
  Glm4MoeAttention(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                   const std::string& prefix)
      : qkv_proj_(ctx, prefix + ".qkv_proj", c.hidden_size, c.head_dim, c.num_attention_heads,
                  c.num_key_value_heads, c.attention_bias),
        o_proj_(ctx, prefix + ".o_proj", c.num_attention_heads * c.head_dim, c.hidden_size, false),
        rotary_(ctx, static_cast<int>(c.head_dim), c.rope, c.max_position_embeddings),
        attn_(ctx, prefix + ".attn",
              {c.num_attention_heads, c.num_key_value_heads, c.head_dim, 0,
               llama_layer_window(c, layer), false}) {
    if (c.text.get_bool("use_qk_norm", false)) {
      q_norm_ = std::make_unique<RMSNorm>(ctx, prefix + ".q_norm", c.head_dim, c.rms_norm_eps);
      k_norm_ = std::make_unique<RMSNorm>(ctx, prefix + ".k_norm", c.head_dim, c.rms_norm_eps);
    }
    q_size_ = qkv_proj_.heads_per_rank() * c.head_dim;
    kv_size_ = qkv_proj_.kv_heads_per_rank() * c.head_dim;
    o_proj_.set_hints({.after_latency_bound = true});  // it follows decode attention
  }

  Tensor forward(Step& step, const Tensor& x) {
    Tensor qkv = qkv_proj_.forward(step, x);
    Tensor q = qkv.narrow(1, 0, q_size_);
    Tensor k = qkv.narrow(1, q_size_, kv_size_);
    Tensor v = qkv.narrow(1, q_size_ + kv_size_, kv_size_);
    // With use_qk_norm, the per-head norms come first (in RoPE's kernel where it can).
    const kernels::QkNorm norms = q_norm_ ? RMSNorm::heads(*q_norm_, *k_norm_) : kernels::QkNorm{};
    // RoPE on the first rot_dim channels
    Tensor o = attn_.forward(step, q, k, v, rotary_, q_norm_ ? &norms : nullptr);
    return o_proj_.forward(step, o);
  }

 private:
  QKVParallelLinear qkv_proj_;
  RowParallelLinear o_proj_;
  std::unique_ptr<RMSNorm> q_norm_, k_norm_;  // [head_dim], with use_qk_norm
  RotaryEmbedding rotary_;
  Attention attn_;
  int64_t q_size_, kv_size_;
};

int64_t glm4_moe_num_experts(const ModelConfig& c) {
  return c.text.has("n_routed_experts") ? c.text.get_int("n_routed_experts")
                                        : c.text.get_int("num_local_experts");
}

std::unique_ptr<FeedForward> glm4_moe_mlp(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                                          const std::string& prefix) {
  if (layer < c.text.get_int("first_k_dense_replace", 0))
    return std::make_unique<GatedMlp>(ctx, prefix, c.hidden_size, c.intermediate_size, false);
  SparseMoeOptions o;
  o.hidden = c.hidden_size;
  o.num_experts = glm4_moe_num_experts(c);
  if (o.num_experts < 1) c.text.bad("n_routed_experts", "must be positive");
  o.moe_intermediate = c.text.get_int("moe_intermediate_size");
  o.router.scoring = kernels::RouterScoring::kSigmoid;
  o.router.top_k = static_cast<int>(c.text.get_int("num_experts_per_tok"));
  if (o.router.top_k < 1 || o.router.top_k > o.num_experts)
    c.text.bad("num_experts_per_tok", fmt::format("must be in [1, {}]", o.num_experts));
  o.router.n_group = static_cast<int>(c.text.get_int("n_group", 1));
  o.router.topk_group = static_cast<int>(c.text.get_int("topk_group", 1));
  if (o.router.n_group < 1 || o.num_experts % o.router.n_group != 0)
    c.text.bad("n_group", fmt::format("must divide n_routed_experts ({})", o.num_experts));
  if (o.router.topk_group < 1 || o.router.topk_group > o.router.n_group ||
      (o.router.n_group > 1 &&
       o.router.topk_group * (o.num_experts / o.router.n_group) < o.router.top_k))
    c.text.bad("topk_group", fmt::format("must be in [1, n_group = {}] and keep at least "
                                         "num_experts_per_tok experts",
                                         o.router.n_group));
  o.router.renormalize = c.text.get_bool("norm_topk_prob", true);
  o.router.routed_scaling_factor =
      static_cast<float>(c.text.get_double("routed_scaling_factor", 1.0));
  o.correction_bias = true;
  o.shared_intermediate = c.text.get_int("n_shared_experts", 0) * o.moe_intermediate;
  o.fuse_shared = ctx.fuse_shared_experts;
  return std::make_unique<SparseMoeBlock>(ctx, prefix, o);
}

class Glm4MoeForCausalLM
    : public DecoderOnlyLM<LlamaDecoderLayer<Glm4MoeAttention, PerLayerMlp<glm4_moe_mlp>>> {
 public:
  using DecoderOnlyLM::DecoderOnlyLM;
  std::vector<std::string> quantization_methods() const override {
    return fp8_quantization_methods();
  }

  WeightLoadSpec weight_load_spec() const override {
    WeightLoadSpec s = Model::weight_load_spec();
    const int64_t E = glm4_moe_num_experts(config());
    const bool fused = fuse_shared_experts() && config().text.get_int("n_shared_experts", 0) > 0;
    // Fused: the shared experts load as expert E of the fused layer (the spec's rename).
    if (fused)
      s.weights_mapping.substr.push_back(
          {".mlp.shared_experts.", ".mlp.experts." + std::to_string(E) + "."});
    s.expert_mapping =
        fused_moe_expert_mapping("gate_proj", "down_proj", "up_proj", fused ? E + 1 : E);
    for (auto& m : fused_moe_stacked_mapping()) s.expert_mapping.push_back(m);
    return s;
  }
};

}  // namespace

ATOM_REGISTER_MODEL_SUPPORTING("Glm4MoeForCausalLM", Glm4MoeForCausalLM, llama_support());

}  // namespace atom
