// Kimi-Linear (transformers' modeling_kimi_linear.py; the backbone of Kimi-K3): Kimi delta
// attention layers (layers/kimi_delta_attention.h) interleaved with multi-head latent attention
// without RoPE (KimiLinearAttention: DeepSeek's MLA whose qk_rope_head_dim channels are split
// off and shared but never rotated; the latent cache), as layer_types says; each followed by a
// dense MLP or by KimiLinearMoE (DeepSeek-V3's router: sigmoid scores plus
// e_score_correction_bias for the choice, top-2-sum groups, renormalised, times
// routed_scaling_factor; beside num_shared_experts shared experts), as mlp_layer_types says.
//
// Config names: transformers saves its attribute_map's targets (num_experts,
// num_experts_per_token, moe_renormalize, num_expert_group, num_shared_experts) and the hub's
// configs carry linear_attn_config {kda_layers, full_attn_layers (1-indexed), num_heads,
// head_dim, short_conv_kernel_size} and first_k_dense_replace; either is read. Checkpoints
// name MoE blocks block_sparse_moe (transformers writes that name for the dense MLPs too) with
// experts.J.w1/w3/w2.
#include "layers/kimi_delta_attention.h"
#include "models/deepseek.h"

namespace atom {

namespace {

// The first of `keys` the config has (transformers' attribute_map names and their targets).
int64_t kimi_int(const ConfigFields& t, std::initializer_list<const char*> keys, int64_t fallback) {
  for (const char* k : keys)
    if (t.has(k)) return t.get_int(k);
  return fallback;
}

const nlohmann::json* linear_attn_config(const ConfigFields& t) {
  const auto& j = t.obj();
  auto it = j.find("linear_attn_config");
  return it != j.end() && it->is_object() ? &*it : nullptr;
}

// Whether layer `layer` is KDA ("linear_attention") or MLA ("full_attention"): layer_types;
// else linear_attn_config's 1-indexed kda_layers / full_attn_layers; else transformers' default
// (full attention on every fourth layer after the first).
bool kimi_is_linear_attention(const ModelConfig& c, int64_t layer) {
  const ConfigFields& t = c.text;
  if (!c.layer_types.empty()) {
    const std::string& ty = c.layer_types.at(static_cast<size_t>(layer));
    if (ty != "linear_attention" && ty != "full_attention")
      t.bad("layer_types", fmt::format("layer {} is '{}', expected linear_attention or "
                                       "full_attention",
                                       layer, ty));
    return ty == "linear_attention";
  }
  if (const nlohmann::json* la = linear_attn_config(t);
      la && la->contains("kda_layers") && la->contains("full_attn_layers")) {
    int found = 0;
    bool linear = false;
    for (const char* key : {"kda_layers", "full_attn_layers"})
      for (const auto& v : (*la)[key]) {
        if (!v.is_number_integer() || v.get<int64_t>() < 1 ||
            v.get<int64_t>() > c.num_hidden_layers)
          t.bad("linear_attn_config", fmt::format("{} has {}, expected 1-indexed layers up to {}",
                                                  key, v.dump(), c.num_hidden_layers));
        if (v.get<int64_t>() == layer + 1) {
          ++found;
          linear = std::string(key) == "kda_layers";
        }
      }
    if (found != 1)
      t.bad("linear_attn_config", fmt::format("layer {} (1-indexed) is in {} of kda_layers and "
                                              "full_attn_layers, expected exactly one",
                                              layer + 1, found));
    return linear;
  }
  return !(layer > 0 && layer % 4 == 0);
}

KimiDeltaAttentionOptions kimi_delta_attention_options(const ModelConfig& c) {
  const ConfigFields& t = c.text;
  const nlohmann::json* la = linear_attn_config(t);
  auto field = [&](const char* name, const char* nested, int64_t fallback) {
    if (t.has(name)) return t.get_int(name);
    if (la && la->contains(nested) && (*la)[nested].is_number_integer())
      return (*la)[nested].get<int64_t>();
    return fallback;
  };
  KimiDeltaAttentionOptions o;
  o.hidden = c.hidden_size;
  o.num_heads = static_cast<int>(field("linear_num_heads", "num_heads", 32));
  o.head_dim = static_cast<int>(field("linear_head_dim", "head_dim", 128));
  o.conv_kernel = static_cast<int>(field("linear_conv_kernel_dim", "short_conv_kernel_size", 4));
  if (o.num_heads < 1) t.bad("linear_num_heads", "must be positive");
  if (o.head_dim < 1) t.bad("linear_head_dim", "must be positive");
  if (o.conv_kernel < 1) t.bad("linear_conv_kernel_dim", "must be positive");
  if (c.hidden_act != "silu")
    t.bad("hidden_act", "must be silu (the short convs and the MLPs), got '" + c.hidden_act + "'");
  o.eps = c.rms_norm_eps;
  return o;
}

// KimiLinearAttention: MLA with no RoPE, softmax scale (qk_nope + qk_rope)^-0.5.
MlaOptions kimi_mla_options(const ModelConfig& c) {
  MlaOptions o = deepseek_mla_options(c, /*interleaved_rope=*/false);
  o.apply_rope = false;
  o.scale = 1.0 / std::sqrt(static_cast<double>(o.qk_nope_head_dim + o.qk_rope_head_dim));
  return o;
}

// The token mixer of a layer: KDA or NoPE MLA, both under self_attn.
class KimiLinearMixer {
 public:
  KimiLinearMixer(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                  const std::string& prefix) {
    if (kimi_is_linear_attention(c, layer))
      kda_ = std::make_unique<KimiDeltaAttention>(ctx, prefix, kimi_delta_attention_options(c));
    else
      mla_ = std::make_unique<MultiHeadLatentAttention>(ctx, prefix, kimi_mla_options(c));
  }
  Tensor forward(Step& step, const Tensor& x) {
    return kda_ ? kda_->forward(step, x) : mla_->forward(step, x);
  }

 private:
  std::unique_ptr<KimiDeltaAttention> kda_;
  std::unique_ptr<MultiHeadLatentAttention> mla_;
};

int64_t kimi_num_experts(const ModelConfig& c) {
  return kimi_int(c.text, {"num_experts", "num_local_experts", "n_routed_experts"}, 256);
}

int64_t kimi_num_shared_experts(const ModelConfig& c) {
  return kimi_int(c.text, {"num_shared_experts", "n_shared_experts"}, 1);
}

// mlp_layer_types ("dense" / "sparse" per layer), else first_k_dense_replace (default 1) dense.
bool kimi_sparse_mlp(const ModelConfig& c, int64_t layer) {
  const ConfigFields& t = c.text;
  if (!t.has("mlp_layer_types")) return layer >= t.get_int("first_k_dense_replace", 1);
  const auto types = t.get_string_list("mlp_layer_types");
  if (static_cast<int64_t>(types.size()) != c.num_hidden_layers)
    t.bad("mlp_layer_types",
          fmt::format("has {} entries for {} layers", types.size(), c.num_hidden_layers));
  const std::string& k = types[static_cast<size_t>(layer)];
  if (k != "dense" && k != "sparse")
    t.bad("mlp_layer_types", "entries must be 'dense' or 'sparse', got '" + k + "'");
  return k == "sparse";
}

std::unique_ptr<FeedForward> kimi_linear_mlp(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                                             const std::string& prefix) {
  const ConfigFields& t = c.text;
  if (!kimi_sparse_mlp(c, layer))
    return std::make_unique<GatedMlp>(ctx, prefix, c.hidden_size, c.intermediate_size, false);
  SparseMoeOptions o;
  o.hidden = c.hidden_size;
  o.num_experts = kimi_num_experts(c);
  if (o.num_experts < 1) t.bad("num_experts", "must be positive");
  o.moe_intermediate = t.get_int("moe_intermediate_size");
  if (o.moe_intermediate < 1) t.bad("moe_intermediate_size", "must be positive");
  o.router.scoring = kernels::RouterScoring::kSigmoid;
  o.router.top_k =
      static_cast<int>(kimi_int(t, {"num_experts_per_token", "num_experts_per_tok"}, 8));
  if (o.router.top_k < 1 || o.router.top_k > o.num_experts)
    t.bad("num_experts_per_token", fmt::format("must be in [1, {}]", o.num_experts));
  o.router.n_group = static_cast<int>(kimi_int(t, {"num_expert_group", "n_group"}, 1));
  o.router.topk_group = static_cast<int>(kimi_int(t, {"topk_group"}, 1));
  const int G = o.router.n_group, keep = o.router.topk_group;
  if (G < 1 || o.num_experts % G != 0)
    t.bad("num_expert_group", fmt::format("must divide num_experts ({})", o.num_experts));
  if (keep < 1 || keep > G || (G > 1 && keep * (o.num_experts / G) < o.router.top_k))
    t.bad("topk_group", fmt::format("must be in [1, num_expert_group = {}] and keep at least "
                                    "num_experts_per_token experts",
                                    G));
  o.router.group_score = kernels::GroupScore::kTop2Sum;
  o.router.renormalize = t.has("moe_renormalize") ? t.get_bool("moe_renormalize", true)
                                                  : t.get_bool("norm_topk_prob", true);
  o.router.routed_scaling_factor = static_cast<float>(t.get_double("routed_scaling_factor", 1.0));
  o.correction_bias = true;
  const int64_t shared = kimi_num_shared_experts(c);
  if (shared < 0) t.bad("num_shared_experts", "must be >= 0");
  o.shared_intermediate = shared * o.moe_intermediate;
  o.fuse_shared = ctx.fuse_shared_experts;
  return std::make_unique<SparseMoeBlock>(ctx, prefix, o);
}

class KimiLinearForCausalLM
    : public DecoderOnlyLM<LlamaDecoderLayer<KimiLinearMixer, PerLayerMlp<kimi_linear_mlp>>> {
 public:
  using DecoderOnlyLM::DecoderOnlyLM;
  WeightLoadSpec weight_load_spec() const override {
    const int64_t E = kimi_num_experts(config());
    WeightLoadSpec s = deepseek_weight_load_spec(*this, E, kimi_num_shared_experts(config()));
    // First: the hub's block_sparse_moe is transformers' mlp (then DeepSeek's renames).
    s.weights_mapping.substr.insert(s.weights_mapping.substr.begin(),
                                    {".block_sparse_moe.", ".mlp."});
    const bool fused = fuse_shared_experts() && kimi_num_shared_experts(config()) > 0;
    for (auto& m : fused_moe_expert_mapping("w1", "w2", "w3", fused ? E + 1 : E))
      s.expert_mapping.push_back(m);
    return s;
  }
};

// KDA ("linear_attention") and NoPE MLA ("full_attention") layers.
ModelSupport kimi_linear_support() {
  ModelSupport s;
  s.layer_types = {"linear_attention", "full_attention"};
  return s;
}

}  // namespace

ATOM_REGISTER_MODEL_SUPPORTING("KimiLinearForCausalLM", KimiLinearForCausalLM,
                               kimi_linear_support());

}  // namespace atom
