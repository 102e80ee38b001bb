// Kimi-K2.5's vision config (MoonVitConfig::parse, models/moonvit.h): each value the tower does
// not implement is an error naming its field when the kimi_k25 fixture loads, as K3's are
// (hybrid_config_test.cpp); the hub's spellings of the same fields load.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "loader/hf_config.h"
#include "models/loading.h"
#include "models/moonvit.h"

namespace atom::test {
namespace {

// Loads the kimi_k25 fixture with its config.json edited by `edit`.
LoadedModel load_k25(const std::function<void(nlohmann::json&)>& edit) {
  TempDir d;
  copy_dir(fixture_dir("kimi_k25"), d.str());
  nlohmann::json c = json_load_file(d.file("config.json"));
  edit(c);
  write_file(d.file("config.json"), c.dump());
  return model_load(d.str(), {});
}

// `edit` applied to the config's vision_config.
std::function<void(nlohmann::json&)> vision(std::function<void(nlohmann::json&)> edit) {
  return [edit](nlohmann::json& c) { edit(c["vision_config"]); };
}

TEST(KimiK25Config, BadVisionValuesAreErrorsNamingTheField) {
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) { v["hidden_act"] = "gelu"; })),
                        "vision_config: field 'hidden_act'", "gelu_pytorch_tanh", "'gelu'");
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) { v["hidden_act"] = 7; })),
                        "field 'hidden_act'");
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) {
                          v["merge_kernel_size"] = nlohmann::json::array({3, 3});
                        })),
                        "field 'merge_kernel_size'", "2x2 merge");
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) {
                          v["merge_kernel_size"] = nlohmann::json::array({2, 2, 2});
                        })),
                        "field 'merge_kernel_size'", "2x2 merge");
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) { v["merge_kernel_size"] = 2; })),
                        "field 'merge_kernel_size'");
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) { v["mm_projector_type"] = "mlp"; })),
                        "field 'mm_projector_type'", "patchmerger (Kimi-K2.5)", "'mlp'");
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) { v["norm_type"] = "batchnorm"; })),
                        "field 'norm_type'", "rmsnorm or layernorm", "'batchnorm'");
  EXPECT_ERROR_CONTAINS(
      load_k25(vision([](auto& v) { v["pos_emb_interpolation_mode"] = "nearest"; })),
      "field 'pos_emb_interpolation_mode'", "bilinear or bicubic", "'nearest'");
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) { v["mlp_type"] = "swiglu"; })),
                        "field 'mlp_type'", "mlp2");
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) { v["pos_emb_type"] = "rope"; })),
                        "field 'pos_emb_type'", "divided_fixed");
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) { v["merge_type"] = "avg_pool"; })),
                        "field 'merge_type'", "sd2_tpool", "'avg_pool'");
  // Widths and sizes.
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) { v["num_attention_heads"] = 3; })),
                        "field 'hidden_size'", "64 over 3");
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) { v["num_attention_heads"] = 32; })),
                        "field 'hidden_size'", "divisible by 4");
  // The width's own field is named: qkv_hidden_size where the config sets it.
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) { v["qkv_hidden_size"] = 66; })),
                        "field 'qkv_hidden_size'", "66 over 4");
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) { v["patch_size"] = 0; })),
                        "field 'patch_size'", "[1, 64]");
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) { v["pos_emb_time"] = 0; })),
                        "field 'pos_emb_time'");
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) { v["mm_hidden_size"] = 32; })),
                        "field 'mm_hidden_size'", "vision width 64");
  EXPECT_ERROR_CONTAINS(load_k25(vision([](auto& v) { v["text_hidden_size"] = 65; })),
                        "field 'text_hidden_size'", "hidden_size 64");
  EXPECT_ERROR_CONTAINS(load_k25([](auto& c) { c["projection_hidden_size"] = 32; }),
                        "field 'projection_hidden_size'", "vision width 64");
  EXPECT_ERROR_CONTAINS(load_k25([](auto& c) { c["projection_layer_norm_eps"] = 2.0; }),
                        "field 'projection_layer_norm_eps'");
  // The image token: missing (under either name), or outside the vocabulary (512).
  EXPECT_ERROR_CONTAINS(load_k25([](auto& c) { c.erase("image_token_id"); }),
                        "field 'image_token_id'", "is missing");
  EXPECT_ERROR_CONTAINS(load_k25([](auto& c) { c["image_token_id"] = 512; }),
                        "field 'image_token_id'", "[0, 511]");
  EXPECT_ERROR_CONTAINS(load_k25([](auto& c) { c["image_token_id"] = "<|media_pad|>"; }),
                        "field 'image_token_id'", "integer");
  EXPECT_ERROR_CONTAINS(load_k25([](auto& c) { c["vision_config"] = "none"; }),
                        "vision_config is missing or not an object");
}

// The hub's names (media_placeholder_token_id, vt_* and init_pos_emb_*) and the fields K2.5's
// tower implements spelled out load, the token and widths as given.
TEST(KimiK25Config, HubNamesAndImplementedValuesLoad) {
  LoadedModel m = load_k25([](auto& c) {
    const int64_t pad = c["image_token_id"];
    c.erase("image_token_id");
    c["media_placeholder_token_id"] = pad;
    auto& v = c["vision_config"];
    v["vt_hidden_size"] = v["hidden_size"];
    v.erase("hidden_size");
    v["init_pos_emb_height"] = v["pos_emb_height"];
    v.erase("pos_emb_height");
    v["mm_projector_type"] = "patchmerger";
    v["norm_type"] = "layernorm";
    v["pos_emb_interpolation_mode"] = "bicubic";
    v["mlp_type"] = "mlp2";
    v["pos_emb_type"] = "divided_fixed";
    v["merge_type"] = "sd2_tpool";
    v["hidden_act"] = "gelu_tanh";
  });
  VisionEncoder* v = m.model->vision_encoder();
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->image_token_id(), 500);
  EXPECT_EQ(v->tokens_for({1, 4, 6}), 6);
}

}  // namespace
}  // namespace atom::test
