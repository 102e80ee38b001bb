// Qwen3-Next (transformers' modular_qwen3_next.py): Gated DeltaNet and gated full-attention
// layers (layer_types), each followed by a mixture of experts with a sigmoid-gated shared expert
// (Qwen3NextSparseMoeBlock), or by a dense MLP in mlp_only_layers / off the decoder_sparse_step.
#include "models/qwen3_next.h"

#include "layers/moe.h"

namespace atom {

namespace {
int64_t positive(const ModelConfig& c, const char* field) {
  const int64_t v = c.text.get_int(field);
  if (v <= 0) c.text.bad(field, "must be positive");
  return v;
}
}  // namespace

Qwen3NextAttention::Qwen3NextAttention(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                                       const std::string& prefix)
    : q_proj_(ctx, prefix + ".q_proj", c.hidden_size, c.num_attention_heads,
              {c.head_dim, c.head_dim}, c.attention_bias),
      k_proj_(ctx, prefix + ".k_proj", c.hidden_size, c.head_dim, c.num_key_value_heads,
              c.attention_bias),
      v_proj_(ctx, prefix + ".v_proj", c.hidden_size, c.head_dim, c.num_key_value_heads,
              c.attention_bias),
      o_proj_(ctx, prefix + ".o_proj", c.num_attention_heads * c.head_dim, c.hidden_size,
              c.attention_bias),
      q_norm_(ctx, prefix + ".q_norm", c.head_dim, c.rms_norm_eps, kernels::RmsNormKind::kGemma),
      k_norm_(ctx, prefix + ".k_norm", c.head_dim, c.rms_norm_eps, kernels::RmsNormKind::kGemma),
      rotary_(ctx, static_cast<int>(c.head_dim), c.rope, c.max_position_embeddings),
      attn_(ctx, prefix + ".attn",
            {c.num_attention_heads, c.num_key_value_heads, c.head_dim, 0, 0, false}) {
  (void)layer;
  o_proj_.set_hints({.after_latency_bound = true});
}

Tensor Qwen3NextAttention::forward(Step& step, const Tensor& x) {
  Tensor qg = q_proj_.forward(step, x);  // [T, Hq D queries | Hq D gates]
  Tensor q = qg.narrow(1, q_proj_.part_offset(0), q_proj_.part_width(0));
  Tensor gate = qg.narrow(1, q_proj_.part_offset(1), q_proj_.part_width(1));
  Tensor k = k_proj_.forward(step, x);
  Tensor v = v_proj_.forward(step, x);
  const kernels::QkNorm norms = RMSNorm::heads(q_norm_, k_norm_);
  Tensor o = attn_.forward(step, q, k, v, rotary_, &norms);  // [T, Hq D]
  kernels::mul_sigmoid(o, o, gate);
  return o_proj_.forward(step, o);
}

GatedDeltaNetOptions qwen3_next_linear_attention_options(const ModelConfig& c,
                                                         bool grouped_projections) {
  GatedDeltaNetOptions o;
  o.hidden = c.hidden_size;
  o.num_k_heads = static_cast<int>(positive(c, "linear_num_key_heads"));
  o.num_v_heads = static_cast<int>(positive(c, "linear_num_value_heads"));
  if (o.num_v_heads % o.num_k_heads != 0)
    c.text.bad("linear_num_value_heads", "must be a multiple of linear_num_key_heads");
  o.k_head_dim = static_cast<int>(positive(c, "linear_key_head_dim"));
  o.v_head_dim = static_cast<int>(positive(c, "linear_value_head_dim"));
  o.conv_kernel = static_cast<int>(c.text.get_int("linear_conv_kernel_dim", 4));
  if (o.conv_kernel < 1) c.text.bad("linear_conv_kernel_dim", "must be positive");
  if (c.hidden_act != "silu")
    c.text.bad("hidden_act", "the gated delta net's conv and gated norm are SiLU only");
  o.eps = c.rms_norm_eps;
  o.grouped_projections = grouped_projections;
  return o;
}

bool qwen3_next_is_linear_attention(const ModelConfig& c, int64_t layer) {
  if (c.layer_types.empty())
    c.text.bad("layer_types", "is missing (every layer's linear_attention or full_attention)");
  const std::string& t = c.layer_types.at(static_cast<size_t>(layer));
  if (t != "linear_attention" && t != "full_attention")
    c.text.bad("layer_types", fmt::format("layer {} is '{}', expected linear_attention or "
                                          "full_attention",
                                          layer, t));
  return t == "linear_attention";
}

std::unique_ptr<FeedForward> qwen3_next_moe(LayerContext& ctx, const ModelConfig& c,
                                            const std::string& prefix, bool renormalize) {
  SparseMoeOptions o;
  o.hidden = c.hidden_size;
  o.num_experts = positive(c, "num_experts");
  o.moe_intermediate = positive(c, "moe_intermediate_size");
  o.router.scoring = kernels::RouterScoring::kSoftmax;
  o.router.top_k = static_cast<int>(c.text.get_int("num_experts_per_tok"));
  if (o.router.top_k < 1 || o.router.top_k > o.num_experts)
    c.text.bad("num_experts_per_tok", fmt::format("must be in [1, {}]", o.num_experts));
  o.router.renormalize = renormalize;
  o.shared_intermediate = c.text.get_int("shared_expert_intermediate_size", 0);
  if (o.shared_intermediate > 0) {
    o.shared_gate = true;  // sigmoid(shared_expert_gate(x)) · shared_expert(x)
    o.shared_name = "shared_expert";
    o.fuse_shared = false;  // the gate is not 1: the shared expert cannot ride as a routed slot
  }
  return std::make_unique<SparseMoeBlock>(ctx, prefix, o);
}

WeightLoadSpec qwen3_next_weight_load_spec(WeightLoadSpec s, int64_t num_experts) {
  // q_proj (query and gate), k_proj and v_proj load apart; gate/up stay fused.
  std::erase_if(s.packed_modules, [](const PackedModule& m) { return m.param == "qkv_proj"; });
  s.weights_mapping.prefix.push_back({"mtp.", std::nullopt});
  if (num_experts > 0) {
    s.expert_mapping = fused_moe_expert_mapping("gate_proj", "down_proj", "up_proj", num_experts);
    for (auto& m : fused_moe_stacked_mapping()) s.expert_mapping.push_back(m);
  }
  return s;
}

namespace {

bool qwen3_next_is_sparse(const ModelConfig& c, int64_t layer) {
  for (const int64_t i : c.text.has("mlp_only_layers") ? c.text.get_int_list("mlp_only_layers")
                                                       : std::vector<int64_t>{})
    if (i == layer) return false;
  const int64_t step = c.text.get_int("decoder_sparse_step", 1);
  if (step < 1) c.text.bad("decoder_sparse_step", "must be at least 1");
  return c.text.get_int("num_experts", 0) > 0 && (layer + 1) % step == 0;
}

}  // namespace

std::unique_ptr<FeedForward> qwen3_next_mlp(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                                            const std::string& prefix) {
  if (!qwen3_next_is_sparse(c, layer))
    return std::make_unique<GatedMlp>(ctx, prefix, c.hidden_size, c.intermediate_size, false);
  return qwen3_next_moe(ctx, c, prefix, c.text.get_bool("norm_topk_prob", true));
}

namespace {

class Qwen3NextForCausalLM
    : public DecoderOnlyLM<Qwen3NextDecoderLayer<PerLayerMlp<qwen3_next_mlp>, true>> {
 public:
  using DecoderOnlyLM::DecoderOnlyLM;
  WeightLoadSpec weight_load_spec() const override {
    return qwen3_next_weight_load_spec(Model::weight_load_spec(),
                                       config().text.get_int("num_experts", 0));
  }
};

}  // namespace

ATOM_REGISTER_MODEL_SUPPORTING("Qwen3NextForCausalLM", Qwen3NextForCausalLM, qwen3_next_support());

}  // namespace atom
