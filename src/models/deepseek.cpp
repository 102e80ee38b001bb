#include "models/deepseek.h"

#include "core/env.h"

namespace atom {

bool deepseek_fused_input_norm_quant() {
  return env_bool("ATOM_ENABLE_DS_INPUT_RMSNORM_QUANT_FUSION", true);
}
bool deepseek_fused_q_norm_quant() { return env_bool("ATOM_ENABLE_DS_QKNORM_QUANT_FUSION", true); }

MlaOptions deepseek_mla_options(const ModelConfig& c, bool interleaved_rope) {
  const ConfigFields& t = c.text;
  MlaOptions o;
  o.hidden = c.hidden_size;
  o.num_heads = c.num_attention_heads;
  // null: no q LoRA (V2-Lite); absent: the transformers default.
  if (t.obj().contains("q_lora_rank") && t.obj()["q_lora_rank"].is_null()) {
    o.q_lora_rank = 0;
  } else {
    o.q_lora_rank = t.get_int("q_lora_rank", 1536);
    if (o.q_lora_rank < 1) t.bad("q_lora_rank", "must be positive or null");
  }
  o.kv_lora_rank = t.get_int("kv_lora_rank", 512);
  o.qk_nope_head_dim = t.get_int("qk_nope_head_dim", 128);
  o.qk_rope_head_dim = t.get_int("qk_rope_head_dim", 64);
  o.v_head_dim = t.get_int("v_head_dim", 128);
  if (o.kv_lora_rank < 1) t.bad("kv_lora_rank", "must be positive");
  if (o.qk_nope_head_dim < 1) t.bad("qk_nope_head_dim", "must be positive");
  if (o.qk_rope_head_dim < 2 || o.qk_rope_head_dim % 2 != 0)
    t.bad("qk_rope_head_dim", "must be positive and even");
  if (o.v_head_dim < 1) t.bad("v_head_dim", "must be positive");
  if (c.rope.partial_rotary_factor != 1.0)
    t.bad("partial_rotary_factor", "is not used by multi-head latent attention (RoPE covers "
                                   "qk_rope_head_dim)");
  o.bias = c.attention_bias;
  o.scale = mla_softmax_scale(o.qk_nope_head_dim + o.qk_rope_head_dim, c.rope);
  o.interleaved_rope = interleaved_rope;
  o.rope = c.rope;
  o.max_position_embeddings = c.max_position_embeddings;
  return o;
}

int64_t deepseek_num_experts(const ModelConfig& c, int64_t fallback) {
  for (const char* k : {"n_routed_experts", "num_experts", "num_local_experts"})
    if (c.text.has(k)) return c.text.get_int(k);
  return fallback;
}

std::unique_ptr<FeedForward> deepseek_moe(LayerContext& ctx, const ModelConfig& c,
                                          const std::string& prefix, SparseMoeOptions o,
                                          int64_t default_experts, int64_t default_shared) {
  const ConfigFields& t = c.text;
  o.hidden = c.hidden_size;
  o.num_experts = deepseek_num_experts(c, default_experts);
  if (o.num_experts < 1) t.bad("n_routed_experts", "must be positive");
  o.moe_intermediate = t.get_int("moe_intermediate_size");
  if (o.moe_intermediate < 1) t.bad("moe_intermediate_size", "must be positive");
  o.router.top_k = static_cast<int>(t.get_int("num_experts_per_tok"));
  if (o.router.top_k < 1 || o.router.top_k > o.num_experts)
    t.bad("num_experts_per_tok", fmt::format("must be in [1, {}]", o.num_experts));
  const int G = o.router.n_group, keep = o.router.topk_group;
  if (G < 1 || o.num_experts % G != 0)
    t.bad("n_group", fmt::format("must divide n_routed_experts ({})", o.num_experts));
  if (keep < 1 || keep > G || (G > 1 && keep * (o.num_experts / G) < o.router.top_k))
    t.bad("topk_group", fmt::format("must be in [1, n_group = {}] and keep at least "
                                    "num_experts_per_tok experts",
                                    G));
  o.router.routed_scaling_factor = static_cast<float>(t.get_double("routed_scaling_factor", 1.0));
  const int64_t shared = t.get_int("n_shared_experts", default_shared);
  if (shared < 0) t.bad("n_shared_experts", "must be >= 0");
  o.shared_intermediate = shared * o.moe_intermediate;
  o.fuse_shared = ctx.fuse_shared_experts;
  return std::make_unique<SparseMoeBlock>(ctx, prefix, o);
}

// indexer_types, else index_topk_pattern ("FSS..." or a list), else index_topk_freq and
// index_skip_topk_offset, as GlmMoeDsaConfig derives them.
std::vector<std::string> dsa_indexer_types(const ModelConfig& c) {
  const ConfigFields& t = c.text;
  const int64_t L = c.num_hidden_layers;
  std::vector<std::string> types;
  const char* field = "indexer_types";
  if (t.has("indexer_types")) {
    types = t.get_string_list("indexer_types");
  } else if (t.has("index_topk_pattern")) {
    field = "index_topk_pattern";
    if (t.obj()["index_topk_pattern"].is_string()) {
      for (char ch : t.get_string("index_topk_pattern")) {
        if (ch != 'F' && ch != 'S') t.bad(field, "must hold only 'F' and 'S'");
        types.push_back(ch == 'F' ? "full" : "shared");
      }
    } else {
      types = t.get_string_list("index_topk_pattern");
    }
  } else {
    const int64_t freq = std::max<int64_t>(t.get_int("index_topk_freq", 1), 1);
    const int64_t offset = t.get_int("index_skip_topk_offset", 2);
    for (int64_t i = 0; i < L; ++i)
      types.push_back(std::max<int64_t>(i - offset + 1, 0) % freq == 0 ? "full" : "shared");
  }
  if (static_cast<int64_t>(types.size()) != L)
    t.bad(field, fmt::format("has {} entries for {} layers", types.size(), L));
  for (const auto& k : types)
    if (k != "full" && k != "shared")
      t.bad(field, "entries must be 'full' or 'shared', got '" + k + "'");
  if (types[0] != "full")
    t.bad(field, "must start with a 'full' layer (a shared layer reuses an earlier selection)");
  return types;
}

WeightLoadSpec deepseek_weight_load_spec(const Model& m, int64_t num_experts,
                                         int64_t default_shared, bool shared_fusable) {
  WeightLoadSpec s = m.Model::weight_load_spec();
  s.packed_modules = {{"gate_proj", "gate_up_proj", "0"}, {"up_proj", "gate_up_proj", "1"}};
  const bool fused = shared_fusable && m.fuse_shared_experts() &&
                     m.config().text.get_int("n_shared_experts", default_shared) > 0;
  // Fused: the shared experts load as expert E of the fused layer (the spec's rename).
  if (fused)
    s.weights_mapping.substr.push_back(
        {".mlp.shared_experts.", ".mlp.experts." + std::to_string(num_experts) + "."});
  s.expert_mapping = fused_moe_expert_mapping("gate_proj", "down_proj", "up_proj",
                                              fused ? num_experts + 1 : num_experts);
  for (auto& e : fused_moe_stacked_mapping()) s.expert_mapping.push_back(e);
  return s;
}

}  // namespace atom
