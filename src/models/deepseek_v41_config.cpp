#include "models/deepseek_v41_config.h"

#include <algorithm>
#include <set>

#include "core/error.h"

namespace atom {

namespace {

using json = nlohmann::json;

// The root fields DeepSeek-V4.1 folds into its text config where the text config lacks them.
constexpr const char* kFoldedRootFields[] = {"architectures",      "dtype",        "bos_token_id",
                                             "eos_token_id",       "pad_token_id", "image_token_id",
                                             "quantization_config"};

// A list of layer ids, each in [0, stop), sorted and without duplicates.
std::vector<int64_t> layer_ids(const ConfigFields& t, const std::string& key, int64_t stop) {
  if (t.has(key) && !t.obj()[key].is_array()) t.bad(key, "must be a list of layer ids");
  const std::vector<int64_t> ids = t.get_int_list(key);
  for (int64_t id : ids)
    if (id < 0 || id >= stop)
      t.bad(key, fmt::format("must hold layer ids in [0, {}), got {}", stop, id));
  for (size_t i = 1; i < ids.size(); ++i)
    if (ids[i] <= ids[i - 1])
      t.bad(key, fmt::format("must be sorted and hold no duplicates, got {} after {}", ids[i],
                             ids[i - 1]));
  return ids;
}

bool contains(const std::vector<int64_t>& ids, int64_t id) {
  return std::binary_search(ids.begin(), ids.end(), id);
}

int64_t positive(const ConfigFields& t, const std::string& key) {
  return t.get_int(key, IntRange{1, INT32_MAX});
}

// The native quantisation block; anything else has no reader. Without one the weights are full
// precision (BF16 or F32: the test fixtures), and false is returned.
bool check_native_quantization(const ConfigFields& text) {
  if (!text.has("quantization_config")) return false;
  if (!text.obj()["quantization_config"].is_object())
    text.bad("quantization_config", "must be an object");
  const ConfigFields q(text.obj()["quantization_config"], text.where() + " (quantization_config)");
  if (q.get_string("quant_method", "") != "fp8")
    q.bad("quant_method", "must be 'fp8' (DeepSeek-V4.1's native FP8 checkpoint format)");
  if (q.obj().value("weight_block_size", json()) != json::array({32, 32}))
    q.bad("weight_block_size", "must be [32, 32]");
  if (q.get_string("scale_fmt", "") != "ue8m0")
    q.bad("scale_fmt", "must be 'ue8m0' (DeepSeek-V4.1's dense weight scales)");
  if (q.get_string("activation_scheme", "") != "dynamic")
    q.bad("activation_scheme", "must be 'dynamic' (FP8 activations quantised per 32 values)");
  if (q.get_string("expert_dtype", "") != "fp4")
    q.bad("expert_dtype", "must be 'fp4' (DeepSeek-V4.1's routed experts are native FP4)");
  return true;
}

}  // namespace

const char* name(V41AttentionMode mode) {
  switch (mode) {
    case V41AttentionMode::kWindow:
      return "window";
    case V41AttentionMode::kFull:
      return "full";
    case V41AttentionMode::kReindex:
      return "reindex";
    case V41AttentionMode::kReuse:
      return "reuse";
  }
  return "?";
}

std::vector<V41LayerAttention> v41_attention_topology(const ConfigFields& t, int64_t layers,
                                                      int64_t draft_layers, int64_t index_topk) {
  const int64_t total = layers + draft_layers;
  if (t.has("compress_ratios") && !t.obj()["compress_ratios"].is_array())
    t.bad("compress_ratios", "must be a list of 0, 1 or 2 per layer");
  const std::vector<int64_t> ratios = t.get_int_list("compress_ratios");
  if (static_cast<int64_t>(ratios.size()) != total)
    t.bad("compress_ratios",
          fmt::format("has {} entries; it must cover {} backbone and {} draft layers",
                      ratios.size(), layers, draft_layers));
  for (int64_t r : ratios)
    if (r < 0 || r > 2) t.bad("compress_ratios", fmt::format("must hold 0, 1 or 2, got {}", r));
  for (int64_t i = layers; i < total; ++i)
    if (ratios[static_cast<size_t>(i)] != 0)
      t.bad("compress_ratios",
            fmt::format("gives draft layer {} ratio {}; draft layers are window-only (0)", i,
                        ratios[static_cast<size_t>(i)]));
  const std::vector<int64_t> kv_sources = layer_ids(t, "kv_source_layer_ids", layers);
  const std::vector<int64_t> index_sources = layer_ids(t, "index_source_layer_ids", layers);
  for (int64_t id : kv_sources)
    if (!contains(index_sources, id))
      t.bad("kv_source_layer_ids",
            fmt::format("holds layer {}, which is not in index_source_layer_ids (a KV owner "
                        "computes its own top-k)",
                        id));
  for (int64_t id : index_sources)
    if (ratios[static_cast<size_t>(id)] == 0)
      t.bad(contains(kv_sources, id) ? "kv_source_layer_ids" : "index_source_layer_ids",
            fmt::format("holds layer {}, which is window-only (compress_ratios 0) and cannot "
                        "own compressed KV or indices",
                        id));
  const int64_t candidate = t.get_int("candidate_source_layer_id", IntRange{-1, INT32_MAX});
  if (candidate != -1 && !contains(index_sources, candidate))
    t.bad("candidate_source_layer_id",
          fmt::format("must be -1 or a layer of index_source_layer_ids, got {}", candidate));
  if (candidate >= 0) {
    const int64_t blocks = positive(t, "candidate_topk_blocks");
    const int64_t block_size = positive(t, "candidate_block_size");
    if (blocks * block_size < index_topk)
      t.bad("candidate_topk_blocks",
            fmt::format("{} blocks of candidate_block_size {} hold {} entries, fewer than "
                        "index_topk {}",
                        blocks, block_size, blocks * block_size, index_topk));
  }

  std::vector<V41LayerAttention> out;
  out.reserve(static_cast<size_t>(total));
  int64_t kv_owner = -1, topk_owner = -1, candidate_kv_owner = -1;
  for (int64_t i = 0; i < total; ++i) {
    V41LayerAttention a;
    a.layer = i;
    a.ratio = static_cast<int>(ratios[static_cast<size_t>(i)]);
    if (a.ratio == 0) {
      out.push_back(a);
      continue;
    }
    if (contains(kv_sources, i)) kv_owner = i;
    if (kv_owner < 0 || ratios[static_cast<size_t>(kv_owner)] != a.ratio)
      t.bad("kv_source_layer_ids",
            fmt::format("gives layer {} (ratio {}) no KV owner of the same ratio at or before "
                        "it{}",
                        i, a.ratio,
                        kv_owner < 0 ? std::string()
                                     : fmt::format(" (the latest is layer {}, ratio {})", kv_owner,
                                                   ratios[static_cast<size_t>(kv_owner)])));
    if (contains(index_sources, i)) topk_owner = i;
    if (topk_owner < kv_owner)  // a KV owner is an index source, so this holds by construction
      t.bad("index_source_layer_ids",
            fmt::format("gives layer {} no index source since its KV owner {}", i, kv_owner));
    if (i == candidate) candidate_kv_owner = kv_owner;
    const bool uses_candidates = candidate >= 0 && i >= candidate;
    if (uses_candidates && candidate_kv_owner != kv_owner)
      t.bad("candidate_source_layer_id",
            fmt::format("is layer {} (KV owner {}), but layer {} after it reads the KV of layer "
                        "{}: candidates cannot cross KV owners",
                        candidate, candidate_kv_owner, i, kv_owner));
    a.mode = i == kv_owner     ? V41AttentionMode::kFull
             : i == topk_owner ? V41AttentionMode::kReindex
                               : V41AttentionMode::kReuse;
    a.kv_owner = kv_owner;
    a.topk_owner = topk_owner;
    a.candidate_owner = uses_candidates ? candidate : -1;
    out.push_back(a);
  }
  return out;
}

DeepseekV41Config DeepseekV41Config::parse(const ModelConfig& c) {
  const ConfigFields& root = c.root;
  DeepseekV41Config v;
  if (root.get_string("model_type", "") != "deepseek_v41")
    root.bad("model_type", "must be 'deepseek_v41' for DeepseekV41ForCausalLM");
  if (root.obj().value("architectures", json()) != json::array({"DeepseekV41ForCausalLM"}))
    root.bad("architectures", "must be [\"DeepseekV41ForCausalLM\"]");
  if (!root.has("text_config"))
    root.bad("text_config", "is missing (DeepSeek-V4.1 keeps its text model there)");
  if (c.text.get_string("model_type", "") != "deepseek_v41_text")
    c.text.bad("model_type", "must be 'deepseek_v41_text'");
  if (!root.has("vision_config") || !root.obj()["vision_config"].is_object() ||
      root.obj()["vision_config"].empty())
    root.bad("vision_config", "must be a non-empty object (DeepSeek-V4.1 declares its tower)");
  v.has_vision_tower = true;

  json folded = c.text.obj();
  for (const char* key : kFoldedRootFields)
    if (root.obj().contains(key) && !folded.contains(key)) folded[key] = root.obj()[key];
  v.text = ConfigFields(std::move(folded), c.text.where());
  const ConfigFields& t = v.text;

  v.quantized = check_native_quantization(t);

  v.hidden = positive(t, "hidden_size");
  v.vocab = positive(t, "vocab_size");
  v.layers = positive(t, "num_hidden_layers");
  v.heads = positive(t, "num_attention_heads");
  v.head_dim = positive(t, "head_dim");
  v.q_lora = positive(t, "q_lora_rank");
  v.o_lora = positive(t, "o_lora_rank");
  v.o_groups = positive(t, "o_groups");
  v.index_heads = positive(t, "index_n_heads");
  v.index_head_dim = positive(t, "index_head_dim");
  v.index_topk = positive(t, "index_topk");
  v.window = positive(t, "sliding_window");
  v.moe_inter = positive(t, "moe_intermediate_size");
  v.experts = positive(t, "n_routed_experts");
  v.top_k = positive(t, "num_experts_per_tok");
  v.hc_mult = positive(t, "hc_mult");
  v.hc_sinkhorn_iters = positive(t, "hc_sinkhorn_iters");
  v.max_positions = positive(t, "max_position_embeddings");
  v.eps = t.get_double("rms_norm_eps", RealRange::positive());
  v.hc_eps = t.get_double("hc_eps", RealRange::positive());

  if (t.get_int("num_key_value_heads", IntRange{0, INT32_MAX}) != 1)
    t.bad("num_key_value_heads", "must be 1 (DeepSeek-V4.1 shares one key/value head)");
  if (t.get_int("n_shared_experts", IntRange{0, INT32_MAX}) != 1)
    t.bad("n_shared_experts", "must be 1 (DeepSeek-V4.1 has one shared expert)");
  if (v.heads % v.o_groups != 0)
    t.bad("o_groups",
          fmt::format("must divide num_attention_heads ({}), got {}", v.heads, v.o_groups));
  if (v.top_k > v.experts)
    t.bad("num_experts_per_tok",
          fmt::format("is {}, more than n_routed_experts ({})", v.top_k, v.experts));
  v.rope_dim = t.get_int("qk_rope_head_dim", IntRange{INT32_MIN, INT32_MAX});
  if (v.rope_dim <= 0 || v.rope_dim % 2 != 0 || v.rope_dim > std::min(v.head_dim, v.index_head_dim))
    t.bad("qk_rope_head_dim",
          fmt::format("must be positive, even and at most head_dim ({}) and index_head_dim "
                      "({}), got {}",
                      v.head_dim, v.index_head_dim, v.rope_dim));
  v.draft_layers = t.get_int("num_nextn_predict_layers", IntRange{0, 1 << 10});

  v.engram_layer_ids = layer_ids(t, "engram_layer_ids", v.layers);
  if (t.has("engram_num_embeddings") && !t.obj()["engram_num_embeddings"].is_array())
    t.bad("engram_num_embeddings", "must be a list of table sizes");
  v.engram_num_embeddings = t.get_int_list("engram_num_embeddings");
  if (v.engram_num_embeddings.size() != v.engram_layer_ids.size())
    t.bad("engram_num_embeddings",
          fmt::format("has {} table sizes for {} engram_layer_ids", v.engram_num_embeddings.size(),
                      v.engram_layer_ids.size()));
  for (int64_t rows : v.engram_num_embeddings)
    if (rows <= 0)
      t.bad("engram_num_embeddings", fmt::format("must hold positive table sizes, got {}", rows));

  v.index_topk_tie_break = t.get_string("index_topk_tie_break", "small_position");
  if (v.index_topk_tie_break != "small_position" && v.index_topk_tie_break != "large_position")
    t.bad("index_topk_tie_break",
          "must be 'small_position' or 'large_position', got '" + v.index_topk_tie_break + "'");
  // The index plane's format: FP8, or FP4 values with E8M0 scales; refused before any weight.
  v.index_cache_dtype = t.get_string("index_cache_dtype", "fp8");
  if (v.index_cache_dtype != "fp8" && v.index_cache_dtype != "fp4")
    t.bad("index_cache_dtype", "must be 'fp8' or 'fp4', got '" + v.index_cache_dtype + "'");
  // FP4 keys carry a scale per 32 elements.
  if (v.index_cache_dtype == "fp4" && v.index_head_dim % 32 != 0)
    t.bad("index_cache_dtype",
          fmt::format("'fp4' needs index_head_dim to be a multiple of 32 (a scale per 32 "
                      "elements), got {}",
                      v.index_head_dim));

  if (t.has("bos_token_id")) v.bos_token_id = t.get_int("bos_token_id");
  if (t.has("pad_token_id")) v.pad_token_id = t.get_int("pad_token_id");
  if (t.has("image_token_id")) v.image_token_id = t.get_int("image_token_id");
  if (t.has("eos_token_id")) v.eos_token_ids = t.get_int_list("eos_token_id");

  v.attention = v41_attention_topology(t, v.layers, v.draft_layers, v.index_topk);
  return v;
}

}  // namespace atom
