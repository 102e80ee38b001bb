// DeepSeek-V4.1's config and CSA2 topology (models/deepseek_v41_config.h), from configs built as
// JSON: a hand-worked topology (the roles below were written from the rules, layer by layer, not
// from the code's output), the released layout's shape, each refused value an error naming its
// field, and the architecture in the registry (models/deepseek_v41.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "loader/hf_config.h"
#include "models/deepseek_v41_config.h"
#include "models/model.h"

namespace atom::test {
namespace {

using json = nlohmann::json;

// 12 backbone layers and one draft layer:
//   layer   0  1  2  3  4  5  6  7  8  9 10 11 | 12 (draft)
//   ratio   0  1  1  1  0  1  2  2  2  1  1  0 |  0
// KV sources 1, 6, 9; index sources 1, 3, 6, 8, 9; no candidates.
json small_config() {
  json text = {{"model_type", "deepseek_v41_text"},
               {"hidden_size", 64},
               {"vocab_size", 256},
               {"num_hidden_layers", 12},
               {"num_nextn_predict_layers", 1},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 1},
               {"head_dim", 32},
               {"qk_rope_head_dim", 8},
               {"q_lora_rank", 16},
               {"o_lora_rank", 16},
               {"o_groups", 2},
               {"index_n_heads", 2},
               {"index_head_dim", 16},
               {"index_topk", 8},
               {"sliding_window", 16},
               {"moe_intermediate_size", 32},
               {"n_routed_experts", 8},
               {"num_experts_per_tok", 2},
               {"n_shared_experts", 1},
               {"hc_mult", 4},
               {"hc_sinkhorn_iters", 20},
               {"hc_eps", 1e-6},
               {"rms_norm_eps", 1e-6},
               {"max_position_embeddings", 4096},
               {"compress_ratios", {0, 1, 1, 1, 0, 1, 2, 2, 2, 1, 1, 0, 0}},
               {"kv_source_layer_ids", {1, 6, 9}},
               {"index_source_layer_ids", {1, 3, 6, 8, 9}},
               {"candidate_source_layer_id", -1},
               {"engram_layer_ids", {1, 7}},
               {"engram_num_embeddings", {1000, 2000}}};
  return {{"architectures", {"DeepseekV41ForCausalLM"}},
          {"model_type", "deepseek_v41"},
          {"dtype", "bfloat16"},
          {"bos_token_id", 0},
          {"eos_token_id", 1},
          {"pad_token_id", 2},
          {"image_token_id", 250},
          {"quantization_config",
           {{"quant_method", "fp8"},
            {"weight_block_size", {32, 32}},
            {"scale_fmt", "ue8m0"},
            {"activation_scheme", "dynamic"},
            {"expert_dtype", "fp4"}}},
          {"text_config", text},
          {"vision_config", {{"model_type", "deepseek_v41_vision"}, {"patch_size", 14}}}};
}

DeepseekV41Config parse(const json& j) {
  return DeepseekV41Config::parse(model_config_parse(j, "config.json"));
}

// small_config() with `edit` applied to its text_config.
DeepseekV41Config parse_text(const std::function<void(json&)>& edit) {
  json j = small_config();
  edit(j["text_config"]);
  return parse(j);
}

constexpr int64_t kNone = -1;
constexpr V41AttentionMode W = V41AttentionMode::kWindow, F = V41AttentionMode::kFull,
                           RI = V41AttentionMode::kReindex, RU = V41AttentionMode::kReuse;

struct Expected {
  V41AttentionMode mode;
  int64_t kv_owner, topk_owner, candidate_owner;
};

void expect_topology(const std::vector<V41LayerAttention>& got, const std::vector<Expected>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("layer " + std::to_string(i));
    EXPECT_EQ(got[i].layer, static_cast<int64_t>(i));
    EXPECT_STREQ(name(got[i].mode), name(want[i].mode));
    EXPECT_EQ(got[i].kv_owner, want[i].kv_owner);
    EXPECT_EQ(got[i].topk_owner, want[i].topk_owner);
    EXPECT_EQ(got[i].candidate_owner, want[i].candidate_owner);
  }
}

TEST(DeepseekV41Config, HandWorkedTopology) {
  const DeepseekV41Config v = parse(small_config());
  // Each compressed layer reads the KV of the latest KV source at or before it (which must have
  // its ratio) and the top-k of the latest index source at or before it; a window-only layer in
  // between changes neither.
  expect_topology(v.attention, {
                                   {W, kNone, kNone, kNone},  // 0
                                   {F, 1, 1, kNone},          // 1: KV and index source
                                   {RU, 1, 1, kNone},         // 2
                                   {RI, 1, 3, kNone},         // 3: index source only
                                   {W, kNone, kNone, kNone},  // 4
                                   {RU, 1, 3, kNone},         // 5
                                   {F, 6, 6, kNone},          // 6: ratio 2's owner
                                   {RU, 6, 6, kNone},         // 7
                                   {RI, 6, 8, kNone},         // 8
                                   {F, 9, 9, kNone},          // 9: back to ratio 1
                                   {RU, 9, 9, kNone},         // 10
                                   {W, kNone, kNone, kNone},  // 11
                                   {W, kNone, kNone, kNone},  // 12: the draft layer
                               });
  EXPECT_EQ(v.attention[6].ratio, 2);
  EXPECT_EQ(v.attention[9].ratio, 1);
  EXPECT_TRUE(v.attention[1].owns_compressor() && v.attention[1].owns_indexer());
  EXPECT_TRUE(!v.attention[3].owns_compressor() && v.attention[3].owns_indexer());
  EXPECT_TRUE(!v.attention[5].owns_compressor() && !v.attention[5].owns_indexer());
  EXPECT_STREQ(name(V41AttentionMode::kWindow), "window");
  EXPECT_STREQ(name(V41AttentionMode::kFull), "full");
  EXPECT_STREQ(name(V41AttentionMode::kReindex), "reindex");
  EXPECT_STREQ(name(V41AttentionMode::kReuse), "reuse");
}

TEST(DeepseekV41Config, CandidatesBoundTheLayersAfterTheirSource) {
  // Layer 9 owns the last KV run (9, 10): it scores the candidate blocks, 10 reads them.
  const DeepseekV41Config v = parse_text([](json& t) {
    t["candidate_source_layer_id"] = 9;
    t["candidate_topk_blocks"] = 2;
    t["candidate_block_size"] = 4;  // 8 entries: exactly index_topk
  });
  expect_topology(v.attention, {
                                   {W, kNone, kNone, kNone},
                                   {F, 1, 1, kNone},
                                   {RU, 1, 1, kNone},
                                   {RI, 1, 3, kNone},
                                   {W, kNone, kNone, kNone},
                                   {RU, 1, 3, kNone},
                                   {F, 6, 6, kNone},
                                   {RU, 6, 6, kNone},
                                   {RI, 6, 8, kNone},
                                   {F, 9, 9, 9},
                                   {RU, 9, 9, 9},
                                   {W, kNone, kNone, kNone},
                                   {W, kNone, kNone, kNone},
                               });
  EXPECT_TRUE(v.attention[9].produces_candidates());
  EXPECT_EQ(v.attention[9].candidate_source(), kNone);
  EXPECT_FALSE(v.attention[10].produces_candidates());
  EXPECT_EQ(v.attention[10].candidate_source(), 9);
  EXPECT_EQ(v.attention[8].candidate_source(), kNone);
}

// The released layout's shape (architectures.md §11 and the reference's tests): 40 backbone
// layers, two window-only, 18 of ratio 2 and 20 of ratio 1, 3 draft layers; KV sources 2, 8, 14,
// 20, four more index sources in the ratio-1 run, candidates from layer 20. The candidate block
// geometry is ours (the release's values are not in the sources read).
TEST(DeepseekV41Config, ReleasedLayout) {
  const DeepseekV41Config v = parse_text([](json& t) {
    json ratios = json::array();
    for (int i = 0; i < 43; ++i) ratios.push_back(i < 2 || i >= 40 ? 0 : (i < 20 ? 2 : 1));
    t["compress_ratios"] = ratios;
    t["num_hidden_layers"] = 40;
    t["num_nextn_predict_layers"] = 3;
    t["kv_source_layer_ids"] = {2, 8, 14, 20};
    t["index_source_layer_ids"] = {2, 8, 14, 20, 24, 28, 32, 36};
    t["candidate_source_layer_id"] = 20;
    t["candidate_topk_blocks"] = 4;
    t["candidate_block_size"] = 2;
    t["engram_layer_ids"] = {1, 14};
  });
  ASSERT_EQ(v.attention.size(), 43u);
  std::vector<int64_t> full, reindex;
  int reuse = 0;
  for (const auto& a : v.attention) {
    if (a.mode == V41AttentionMode::kFull) full.push_back(a.layer);
    if (a.mode == V41AttentionMode::kReindex) reindex.push_back(a.layer);
    if (a.mode == V41AttentionMode::kReuse) ++reuse;
  }
  EXPECT_EQ(full, (std::vector<int64_t>{2, 8, 14, 20}));
  EXPECT_EQ(reindex, (std::vector<int64_t>{24, 28, 32, 36}));
  EXPECT_EQ(reuse, 30);  // 38 compressed layers less 4 FULL and 4 REINDEX
  EXPECT_EQ(v.attention[19].kv_owner, 14);
  EXPECT_EQ(v.attention[19].topk_owner, 14);
  EXPECT_EQ(v.attention[19].candidate_owner, kNone);
  EXPECT_EQ(v.attention[39].kv_owner, 20);
  EXPECT_EQ(v.attention[39].topk_owner, 36);
  EXPECT_EQ(v.attention[39].candidate_source(), 20);
  EXPECT_TRUE(v.attention[20].produces_candidates());
  for (int i = 40; i < 43; ++i) EXPECT_EQ(v.attention[i].mode, V41AttentionMode::kWindow);
  // A ratio-1 layer inside the ratio-2 run has no KV owner of its own ratio.
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) {
                          json ratios = json::array();
                          for (int i = 0; i < 43; ++i)
                            ratios.push_back(i < 2 || i >= 40 ? 0 : (i < 20 ? 2 : 1));
                          ratios[7] = 1;
                          t["compress_ratios"] = ratios;
                          t["num_hidden_layers"] = 40;
                          t["num_nextn_predict_layers"] = 3;
                          t["kv_source_layer_ids"] = {2, 8, 14, 20};
                          t["index_source_layer_ids"] = {2, 8, 14, 20, 24, 28, 32, 36};
                        }),
                        "field 'kv_source_layer_ids'", "layer 7 (ratio 1)",
                        "latest is layer 2, ratio 2");
}

TEST(DeepseekV41Config, RootFieldsFoldIntoTheTextConfig) {
  const DeepseekV41Config v = parse(small_config());
  EXPECT_TRUE(v.has_vision_tower);
  EXPECT_EQ(v.bos_token_id, 0);
  EXPECT_EQ(v.eos_token_ids, (std::vector<int64_t>{1}));
  EXPECT_EQ(v.pad_token_id, 2);
  EXPECT_EQ(v.image_token_id, 250);
  EXPECT_EQ(v.text.obj()["quantization_config"]["expert_dtype"], "fp4");
  EXPECT_EQ(v.text.obj()["dtype"], "bfloat16");
  EXPECT_EQ(v.layers, 12);
  EXPECT_EQ(v.draft_layers, 1);
  EXPECT_EQ(v.rope_dim, 8);
  EXPECT_EQ(v.index_topk_tie_break, "small_position");
  EXPECT_EQ(v.engram_num_embeddings, (std::vector<int64_t>{1000, 2000}));
  // The text config's own value wins over the root's.
  json j = small_config();
  j["text_config"]["image_token_id"] = 251;
  EXPECT_EQ(parse(j).image_token_id, 251);
}

TEST(DeepseekV41Config, IndexCacheDtype) {
  EXPECT_EQ(parse(small_config()).index_cache_dtype, "fp8");
  EXPECT_EQ(parse_text([](json& t) { t["index_cache_dtype"] = "fp8"; }).index_cache_dtype, "fp8");
  EXPECT_EQ(parse_text([](json& t) {
              t["index_cache_dtype"] = "fp4";
              t["index_head_dim"] = 32;
            }).index_cache_dtype,
            "fp4");
  // FP4 keys carry a scale per 32 elements: index_head_dim 16 cannot hold one.
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) { t["index_cache_dtype"] = "fp4"; }),
                        "field 'index_cache_dtype'", "multiple of 32", "16");
  for (const char* bad : {"bf16", "fp16", "FP8", ""})
    EXPECT_ERROR_CONTAINS(parse_text([bad](json& t) { t["index_cache_dtype"] = bad; }),
                          "(text_config): field 'index_cache_dtype'", "'fp8' or 'fp4'");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) { t["index_cache_dtype"] = 8; }),
                        "field 'index_cache_dtype'");
}

TEST(DeepseekV41Config, TieBreak) {
  EXPECT_EQ(parse_text([](json& t) {
              t["index_topk_tie_break"] = "large_position";
            }).index_topk_tie_break,
            "large_position");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) { t["index_topk_tie_break"] = "random"; }),
                        "field 'index_topk_tie_break'", "small_position", "large_position");
}

TEST(DeepseekV41Config, WrapperErrorsNameTheField) {
  json j = small_config();
  j["model_type"] = "deepseek_v4";
  EXPECT_ERROR_CONTAINS(parse(j), "config.json: field 'model_type'", "deepseek_v41");
  j = small_config();
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  EXPECT_ERROR_CONTAINS(parse(j), "field 'architectures'", "DeepseekV41ForCausalLM");
  j = small_config();
  j["text_config"]["model_type"] = "deepseek_v4";
  EXPECT_ERROR_CONTAINS(parse(j), "(text_config): field 'model_type'", "deepseek_v41_text");
  j = small_config();
  j.erase("vision_config");
  EXPECT_ERROR_CONTAINS(parse(j), "field 'vision_config'");
  j = small_config();
  j["vision_config"] = json::object();
  EXPECT_ERROR_CONTAINS(parse(j), "field 'vision_config'", "non-empty");
  j = small_config();
  json text = j["text_config"];
  j.erase("text_config");
  for (auto it = text.begin(); it != text.end(); ++it)
    if (it.key() != "model_type") j[it.key()] = it.value();
  EXPECT_ERROR_CONTAINS(parse(j), "field 'text_config'");
}

TEST(DeepseekV41Config, QuantizationErrorsNameTheField) {
  const auto with = [](const char* key, json value) {
    json j = small_config();
    j["quantization_config"][key] = std::move(value);
    return parse(j);
  };
  EXPECT_ERROR_CONTAINS(with("quant_method", "mxfp4"), "(quantization_config): field "
                                                       "'quant_method'");
  EXPECT_ERROR_CONTAINS(with("weight_block_size", {128, 128}), "field 'weight_block_size'",
                        "[32, 32]");
  EXPECT_ERROR_CONTAINS(with("scale_fmt", "e8m0"), "field 'scale_fmt'", "ue8m0");
  EXPECT_ERROR_CONTAINS(with("activation_scheme", "static"), "field 'activation_scheme'");
  EXPECT_ERROR_CONTAINS(with("expert_dtype", "fp8"), "field 'expert_dtype'", "fp4");
  json j = small_config();
  EXPECT_TRUE(parse(j).quantized);
  // Without a quantization_config the weights are full precision (the test fixtures).
  j.erase("quantization_config");
  EXPECT_FALSE(parse(j).quantized);
  // The text config's own block is the one checked when it has one.
  j = small_config();
  j["text_config"]["quantization_config"] = j["quantization_config"];
  j["text_config"]["quantization_config"]["scale_fmt"] = "fp32";
  EXPECT_ERROR_CONTAINS(parse(j), "(text_config) (quantization_config): field 'scale_fmt'");
}

TEST(DeepseekV41Config, SizeErrorsNameTheField) {
  for (const char* key :
       {"hidden_size", "vocab_size", "num_attention_heads", "head_dim", "q_lora_rank",
        "o_lora_rank", "o_groups", "index_n_heads", "index_head_dim", "index_topk",
        "sliding_window", "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok",
        "hc_mult", "hc_sinkhorn_iters", "max_position_embeddings", "rms_norm_eps", "hc_eps"}) {
    SCOPED_TRACE(key);
    EXPECT_ERROR_CONTAINS(parse_text([key](json& t) { t[key] = 0; }),
                          std::string("field '") + key + "'");
    EXPECT_ERROR_CONTAINS(parse_text([key](json& t) { t.erase(key); }),
                          std::string("field '") + key + "'");
  }
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) { t["num_key_value_heads"] = 2; }),
                        "field 'num_key_value_heads'", "must be 1");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) { t["n_shared_experts"] = 2; }),
                        "field 'n_shared_experts'", "must be 1");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) { t["o_groups"] = 3; }), "field 'o_groups'",
                        "divide num_attention_heads (4)");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) { t["num_experts_per_tok"] = 9; }),
                        "field 'num_experts_per_tok'", "n_routed_experts (8)");
  for (int rope : {0, -2, 7, 18, 34}) {  // even, positive, <= min(head_dim 32, index 16)
    SCOPED_TRACE(rope);
    EXPECT_ERROR_CONTAINS(parse_text([rope](json& t) { t["qk_rope_head_dim"] = rope; }),
                          "field 'qk_rope_head_dim'");
  }
  EXPECT_EQ(parse_text([](json& t) { t["qk_rope_head_dim"] = 16; }).rope_dim, 16);
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) { t["num_nextn_predict_layers"] = -1; }),
                        "field 'num_nextn_predict_layers'");
}

TEST(DeepseekV41Config, EngramErrorsNameTheField) {
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) {
                          t["engram_layer_ids"] = {1, 12};
                        }),
                        "field 'engram_layer_ids'", "[0, 12)", "got 12");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) {
                          t["engram_layer_ids"] = {7, 1};
                        }),
                        "field 'engram_layer_ids'", "sorted");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) {
                          t["engram_layer_ids"] = {1, 1};
                        }),
                        "field 'engram_layer_ids'", "duplicates");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) { t["engram_num_embeddings"] = {1000}; }),
                        "field 'engram_num_embeddings'", "1 table sizes for 2");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) {
                          t["engram_num_embeddings"] = {1000, 0};
                        }),
                        "field 'engram_num_embeddings'", "positive");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) { t.erase("engram_layer_ids"); }),
                        "field 'engram_layer_ids'", "missing");
  // No engram layers at all is a valid config.
  EXPECT_TRUE(parse_text([](json& t) {
                t["engram_layer_ids"] = json::array();
                t["engram_num_embeddings"] = json::array();
              }).engram_layer_ids.empty());
}

TEST(DeepseekV41Config, TopologyErrorsNameTheField) {
  // compress_ratios: one per backbone and draft layer, each 0, 1 or 2, drafts window-only.
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) { t["compress_ratios"].erase(12); }),
                        "field 'compress_ratios'", "12 entries", "12 backbone and 1 draft");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) { t["compress_ratios"][5] = 4; }),
                        "field 'compress_ratios'", "0, 1 or 2, got 4");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) { t["compress_ratios"][12] = 1; }),
                        "field 'compress_ratios'", "draft layer 12", "window-only");
  // Source lists: existing backbone layers, sorted, no duplicates.
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) {
                          t["kv_source_layer_ids"] = {1, 6, 12};
                        }),
                        "field 'kv_source_layer_ids'", "[0, 12)", "got 12");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) {
                          t["index_source_layer_ids"] = {-1, 1};
                        }),
                        "field 'index_source_layer_ids'", "got -1");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) {
                          t["kv_source_layer_ids"] = {6, 1, 9};
                        }),
                        "field 'kv_source_layer_ids'", "sorted");
  EXPECT_ERROR_CONTAINS(
      parse_text([](json& t) { t["index_source_layer_ids"] = {1, 3, 3, 6, 8, 9}; }),
      "field 'index_source_layer_ids'", "duplicates");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) { t.erase("kv_source_layer_ids"); }),
                        "field 'kv_source_layer_ids'", "missing");
  // A KV source that is not an index source.
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) {
                          t["index_source_layer_ids"] = {1, 3, 8, 9};
                        }),
                        "field 'kv_source_layer_ids'", "layer 6", "not in index_source_layer_ids");
  // A window-only layer owning KV, or indices.
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) {
                          t["kv_source_layer_ids"] = {1, 4, 6, 9};
                          t["index_source_layer_ids"] = {1, 3, 4, 6, 8, 9};
                        }),
                        "field 'kv_source_layer_ids'", "layer 4", "window-only");
  EXPECT_ERROR_CONTAINS(
      parse_text([](json& t) { t["index_source_layer_ids"] = {1, 3, 4, 6, 8, 9}; }),
      "field 'index_source_layer_ids'", "layer 4", "window-only");
  // No KV owner before the first compressed layer; one of another ratio.
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) {
                          t["kv_source_layer_ids"] = {2, 6, 9};
                          t["index_source_layer_ids"] = {2, 3, 6, 8, 9};
                        }),
                        "field 'kv_source_layer_ids'", "layer 1 (ratio 1)");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) {
                          t["kv_source_layer_ids"] = {1, 6};
                          t["index_source_layer_ids"] = {1, 3, 6, 8};
                        }),
                        "field 'kv_source_layer_ids'", "layer 9 (ratio 1)",
                        "latest is layer 6, ratio 2");
  // Candidates: an index source or -1; positive blocks holding a whole top-k; one KV owner.
  const auto candidate = [](int64_t layer, int64_t blocks, int64_t size) {
    return [=](json& t) {
      t["candidate_source_layer_id"] = layer;
      t["candidate_topk_blocks"] = blocks;
      t["candidate_block_size"] = size;
    };
  };
  EXPECT_ERROR_CONTAINS(parse_text(candidate(10, 2, 4)), "field 'candidate_source_layer_id'",
                        "index_source_layer_ids, got 10");
  EXPECT_ERROR_CONTAINS(parse_text(candidate(-2, 2, 4)), "field 'candidate_source_layer_id'");
  EXPECT_ERROR_CONTAINS(parse_text(candidate(9, 0, 4)), "field 'candidate_topk_blocks'");
  EXPECT_ERROR_CONTAINS(parse_text(candidate(9, 2, 0)), "field 'candidate_block_size'");
  EXPECT_ERROR_CONTAINS(parse_text(candidate(9, 1, 7)), "field 'candidate_topk_blocks'",
                        "hold 7 entries", "index_topk 8");
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) {
                          t["candidate_source_layer_id"] = 9;
                          t.erase("candidate_block_size");
                        }),
                        "field 'candidate_topk_blocks'");
  // Layer 8's KV owner is 6; layer 9 after it owns its own KV.
  EXPECT_ERROR_CONTAINS(parse_text(candidate(8, 2, 4)), "field 'candidate_source_layer_id'",
                        "layer 9", "cannot cross KV owners");
  EXPECT_ERROR_CONTAINS(parse_text(candidate(3, 2, 4)), "field 'candidate_source_layer_id'",
                        "layer 6");
  // Without candidates the block fields are not read.
  EXPECT_NO_THROW(parse_text([](json& t) { t["candidate_topk_blocks"] = 0; }));
  EXPECT_ERROR_CONTAINS(parse_text([](json& t) { t.erase("candidate_source_layer_id"); }),
                        "field 'candidate_source_layer_id'", "missing");
}

// The model (models/deepseek_v41.cpp) registers the architecture.
TEST(DeepseekV41Config, ArchitectureIsRegistered) {
  const auto list = model_registry_list();
  EXPECT_NE(std::find(list.begin(), list.end(), "DeepseekV41ForCausalLM"), list.end());
}

}  // namespace
}  // namespace atom::test
