// DeepSeek-V4.1's config (DeepseekV41ForCausalLM; ROCm/ATOM's atom/models/deepseek_v41/config.py,
// no transformers model) and its CSA2 attention topology, read and checked once before anything
// is built. The model is models/deepseek_v41.cpp (docs/deepseek_v41.md).
//   * The file: model_type deepseek_v41 with a text_config (model_type deepseek_v41_text) and a
//     vision_config, both required; atom serves the text model and only records that a tower
//     exists. The root's architectures, dtype, bos/eos/pad/image_token_id and
//     quantization_config are folded into the text fields where the text config lacks them.
//   * Weights in the native format: quant_method fp8, weight_block_size [32, 32], scale_fmt
//     ue8m0, activation_scheme dynamic (per-32 FP8 activations), expert_dtype fp4; or, without a
//     quantization_config, full precision (BF16 / F32, the test fixtures).
//   * CSA2: compress_ratios gives each layer (num_hidden_layers backbone layers, then
//     num_nextn_predict_layers draft layers) 0 (sliding window only), 1 or 2. A compressed layer
//     takes its compressed KV from the latest kv_source_layer_ids layer at or before it and its
//     top-k indices from the latest index_source_layer_ids layer at or before it:
//       WINDOW   ratio 0: the window only, no owners;
//       FULL     a KV source: owns its compressor and its indexer;
//       REINDEX  an index source but no KV source: reads the KV owner's entries, scores its own
//                top-k;
//       REUSE    neither: reads both the KV owner's entries and the top-k owner's indices.
//     candidate_source_layer_id (-1: none) is a layer whose top candidate_topk_blocks blocks of
//     candidate_block_size entries bound the top-k search of it and every compressed layer after
//     it, all of which must share its KV owner.
// Every value refused is an Error naming its field (ConfigFields::bad).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loader/hf_config.h"

namespace atom {

enum class V41AttentionMode { kWindow, kFull, kReindex, kReuse };

// "window", "full", "reindex", "reuse".
const char* name(V41AttentionMode mode);

// One layer's attention role, resolved once from the topology fields. Owners are layer ids; -1
// where the layer has none (every owner of a WINDOW layer).
struct V41LayerAttention {
  int64_t layer = 0;
  int ratio = 0;  // compress_ratios[layer]: 0, 1 or 2
  V41AttentionMode mode = V41AttentionMode::kWindow;
  int64_t kv_owner = -1;         // whose compressor (and compressed KV) this layer reads
  int64_t topk_owner = -1;       // whose indexer top-k this layer attends to
  int64_t candidate_owner = -1;  // candidate_source_layer_id when it bounds this layer
  // The candidate owner scores the blocks; the layers after it read them.
  bool produces_candidates() const { return candidate_owner >= 0 && candidate_owner == layer; }
  int64_t candidate_source() const { return produces_candidates() ? -1 : candidate_owner; }
  bool owns_compressor() const { return mode == V41AttentionMode::kFull; }
  bool owns_indexer() const {
    return mode == V41AttentionMode::kFull || mode == V41AttentionMode::kReindex;
  }
};

// The CSA2 topology of `t` (the text fields): one entry per backbone and draft layer, in order.
// `layers` is num_hidden_layers, `draft_layers` num_nextn_predict_layers, `index_topk` the
// indexer's top-k (which the candidate blocks must be able to hold).
std::vector<V41LayerAttention> v41_attention_topology(const ConfigFields& t, int64_t layers,
                                                      int64_t draft_layers, int64_t index_topk);

struct DeepseekV41Config {
  // The text fields with the root's folded in; errors name "config.json (text_config)".
  ConfigFields text;
  bool has_vision_tower = false;  // vision_config is present (atom serves text only)

  int64_t hidden = 0, vocab = 0, layers = 0, draft_layers = 0;
  int64_t heads = 0, head_dim = 0, rope_dim = 0;  // rope_dim: qk_rope_head_dim
  int64_t q_lora = 0, o_lora = 0, o_groups = 0, window = 0, max_positions = 0;
  int64_t index_heads = 0, index_head_dim = 0, index_topk = 0;
  std::string index_topk_tie_break;  // small_position | large_position
  std::string index_cache_dtype;     // fp8 (default) | fp4
  int64_t experts = 0, top_k = 0, moe_inter = 0;
  int64_t hc_mult = 0, hc_sinkhorn_iters = 0;
  double eps = 0, hc_eps = 0;
  std::vector<int64_t> engram_layer_ids, engram_num_embeddings;
  std::optional<int64_t> bos_token_id, pad_token_id, image_token_id;
  std::vector<int64_t> eos_token_ids;
  // The native quantisation (the only one V4.1 reads): FP8 weights in 32 x 32 blocks with UE8M0
  // scales, dynamic FP8 activations per 32, FP4 routed experts. Without a quantization_config
  // (quantized false) the weights are full precision, BF16 or F32 (atom's test fixtures).
  bool quantized = false;
  int64_t weight_block_rows = 32, weight_block_cols = 32, activation_block = 32;

  std::vector<V41LayerAttention> attention;  // one per backbone and draft layer

  static DeepseekV41Config parse(const ModelConfig& c);
};

}  // namespace atom
