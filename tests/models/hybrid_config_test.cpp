// Hybrid (Gated DeltaNet, Kimi delta attention) configs and checkpoints: a bad field is an error
// naming it, before any weight is read; the vision tower and MTP tensors of the checkpoints are
// skipped unread; the state each linear-attention layer declares for the slot pool has the shapes
// of its config.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "common/fixtures.h"
#include "engine/sequence_runner.h"
#include "common/test_util.h"
#include "loader/hf_config.h"
#include "models/loading.h"

namespace atom::test {
namespace {

// Loads fixture `name` with its config.json edited by `edit`.
LoadedModel load_edited(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  TempDir d;
  copy_dir(fixture_dir(name), d.str());
  nlohmann::json c = json_load_file(d.file("config.json"));
  edit(c);
  write_file(d.file("config.json"), c.dump());
  return model_load(d.str(), {});
}

TEST(HybridConfig, BadFieldsAreErrorsNamingThem) {
  EXPECT_ERROR_CONTAINS(load_edited("qwen3_next", [](auto& c) { c["linear_num_value_heads"] = 3; }),
                        "'linear_num_value_heads'", "multiple of linear_num_key_heads");
  EXPECT_ERROR_CONTAINS(load_edited("qwen3_next", [](auto& c) { c["linear_key_head_dim"] = 0; }),
                        "'linear_key_head_dim'", "positive");
  EXPECT_ERROR_CONTAINS(
      load_edited("qwen3_next", [](auto& c) { c["layer_types"][1] = "sliding_attention"; }),
      "'layer_types'", "sliding_attention");
  EXPECT_ERROR_CONTAINS(load_edited("qwen3_next", [](auto& c) { c["hidden_act"] = "gelu"; }),
                        "'hidden_act'");
  EXPECT_ERROR_CONTAINS(
      load_edited("qwen3_5_moe", [](auto& c) { c["text_config"]["num_experts_per_tok"] = 9; }),
      "'num_experts_per_tok'", "[1, 8]");
  EXPECT_ERROR_CONTAINS(
      load_edited("qwen3_5", [](auto& c) { c["text_config"].erase("linear_num_key_heads"); }),
      "'linear_num_key_heads'", "missing");
}

TEST(HybridConfig, VisionAndMtpTensorsAreSkippedUnread) {
  // qwen3_5_moe: 21 vision tensors and 3 mtp tensors; qwen3_next: 3 mtp tensors.
  LoadedModel vl = model_load(fixture_dir("qwen3_5_moe"), {});
  EXPECT_EQ(vl.report.tensors_not_wanted, 24);
  LoadedModel next = model_load(fixture_dir("qwen3_next"), {});
  EXPECT_EQ(next.report.tensors_not_wanted, 3);
}

TEST(HybridConfig, EachLinearAttentionLayerDeclaresItsConvAndRecurrentState) {
  // qwen3_next: layers 0, 1, 3 are linear attention; conv_dim = 2 * 2 * 16 + 4 * 24 = 160,
  // kernel 4.
  LoadedModel m = model_load(fixture_dir("qwen3_next"), {});
  const auto& s = m.model->state_specs();
  ASSERT_EQ(s.size(), 6u);
  for (size_t l = 0; l < 3; ++l) {
    EXPECT_EQ(s[2 * l].shape, (Shape{160, 3}));
    EXPECT_EQ(s[2 * l + 1].shape, (Shape{4, 16, 24}));
    EXPECT_EQ(s[2 * l + 1].dtype, DType::kF32);
  }
  EXPECT_EQ(m.model->cache_specs().size(), 1u);  // one full-attention layer's K/V
}

TEST(HybridConfig, KimiLinearBadFieldsAreErrorsNamingThem) {
  EXPECT_ERROR_CONTAINS(
      load_edited("kimi_linear", [](auto& c) { c["layer_types"][1] = "sliding_attention"; }),
      "'layer_types'", "sliding_attention");
  EXPECT_ERROR_CONTAINS(
      load_edited("kimi_linear", [](auto& c) { c["mlp_layer_types"][1] = "moe"; }),
      "'mlp_layer_types'", "'moe'");
  EXPECT_ERROR_CONTAINS(load_edited("kimi_linear", [](auto& c) { c["linear_head_dim"] = 0; }),
                        "'linear_head_dim'", "positive");
  EXPECT_ERROR_CONTAINS(load_edited("kimi_linear", [](auto& c) { c["num_experts_per_token"] = 9; }),
                        "'num_experts_per_token'", "[1, 8]");
  EXPECT_ERROR_CONTAINS(load_edited("kimi_linear", [](auto& c) { c["hidden_act"] = "gelu"; }),
                        "'hidden_act'");
  EXPECT_ERROR_CONTAINS(
      load_edited(
          "kimi_linear",
          [](auto& c) {
            c.erase("layer_types");
            c["linear_attn_config"] = {{"kda_layers", {1, 2, 3, 4}}, {"full_attn_layers", {3}}};
          }),
      "'linear_attn_config'", "layer 3 (1-indexed) is in 2");
}

// The hub's config layout: linear_attn_config (1-indexed layer lists, the KDA shape) and
// first_k_dense_replace instead of transformers' flattened fields; the same logits.
TEST(HybridConfig, KimiLinearHubConfigLayoutGivesTheSameLogits) {
  const Reference ref = reference_load("kimi_linear");
  LoadedModel m = load_edited("kimi_linear", [](auto& c) {
    for (const char* k :
         {"layer_types", "linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim"})
      c.erase(k);
    c["linear_attn_config"] = {{"kda_layers", {1, 2, 4}},
                               {"full_attn_layers", {3}},
                               {"num_heads", 4},
                               {"head_dim", 16},
                               {"short_conv_kernel_size", 4}};
  });
  expect_cpu_parity(score_tokens(*m.model, ref.input_ids), ref.logits, "kimi_linear",
                    "kimi_linear, hub config layout");
  // first_k_dense_replace alone (every layer past the first sparse) is another model: its
  // layer 2 wants MoE tensors, and the checkpoint's dense ones match nothing.
  EXPECT_ERROR_CONTAINS(load_edited("kimi_linear",
                                    [](auto& c) {
                                      c.erase("mlp_layer_types");
                                      c["first_k_dense_replace"] = 1;
                                    }),
                        "match no parameter", "model.layers.2.block_sparse_moe.gate_proj");
}

TEST(HybridConfig, EachKdaLayerDeclaresItsConvAndRecurrentState) {
  // kimi_linear: layers 0, 1, 3 are KDA, 4 heads of 16: three convs (q, k, v) of 64 channels,
  // kernel 4, and a [4, 16, 16] state; layer 2's MLA keeps one latent row per token.
  LoadedModel m = model_load(fixture_dir("kimi_linear"), {});
  const auto& s = m.model->state_specs();
  ASSERT_EQ(s.size(), 12u);
  for (size_t l = 0; l < 3; ++l) {
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(s[4 * l + i].shape, (Shape{64, 3}));
    EXPECT_EQ(s[4 * l + 3].shape, (Shape{4, 16, 16}));
    EXPECT_EQ(s[4 * l + 3].dtype, DType::kF32);
  }
  ASSERT_EQ(m.model->cache_specs().size(), 1u);
  EXPECT_EQ(m.model->cache_specs()[0].kind, CacheKind::kLatent);
  // transformers saves max_position_embeddings as model_max_length (its attribute_map).
  EXPECT_EQ(m.model->config().max_position_embeddings, 512);
}

// Kimi-K3 (its text model): the fields K3 adds are checked before any weight is read, and the
// vision tower's and projector's tensors are skipped unread.
// The K3 fixture's vision tower loads (models/moonvit.h); a K3 config whose vision_config does
// not describe one (kimi_k3_mxfp4's) skips its tensors unread.
TEST(HybridConfig, KimiK3FieldsAreCheckedAndTheVisionTowerLoadedOrSkipped) {
  auto text = [](std::function<void(nlohmann::json&)> f) {
    return [f](nlohmann::json& c) { f(c["text_config"]); };
  };
  EXPECT_ERROR_CONTAINS(load_edited("kimi_k3", text([](auto& t) { t["hidden_act"] = "gelu"; })),
                        "'hidden_act'");
  EXPECT_ERROR_CONTAINS(
      load_edited("kimi_k3", text([](auto& t) { t["activation_situ_beta"] = 0; })),
      "'activation_situ_beta'", "positive");
  EXPECT_ERROR_CONTAINS(
      load_edited("kimi_k3", text([](auto& t) { t["activation_situ_linear_beta"] = -2; })),
      "'activation_situ_linear_beta'", "positive");
  EXPECT_ERROR_CONTAINS(load_edited("kimi_k3", text([](auto& t) {
                                      t["linear_attn_config"]["gate_lower_bound"] = 5.0;
                                    })),
                        "'linear_attn_config'", "gate_lower_bound must be a negative number");
  EXPECT_ERROR_CONTAINS(load_edited("kimi_k3", text([](auto& t) {
                                      t["linear_attn_config"]["use_full_rank_gate"] = "yes";
                                    })),
                        "'linear_attn_config'", "use_full_rank_gate");
  EXPECT_ERROR_CONTAINS(load_edited("kimi_k3", text([](auto& t) { t["attn_res_block_size"] = 0; })),
                        "'attn_res_block_size'", "positive or null");
  EXPECT_ERROR_CONTAINS(
      load_edited("kimi_k3", text([](auto& t) { t["routed_expert_hidden_size"] = 0; })),
      "'routed_expert_hidden_size'", "positive or null");
  // Without the full-rank gate the KDA layers' g_proj belongs to nothing.
  EXPECT_ERROR_CONTAINS(load_edited("kimi_k3", text([](auto& t) {
                                      t["linear_attn_config"]["use_full_rank_gate"] = false;
                                    })),
                        "match no parameter", "layers.0.self_attn.g_proj.weight");
  auto vision = [](std::function<void(nlohmann::json&)> f) {
    return [f](nlohmann::json& c) { f(c["vision_config"]); };
  };
  EXPECT_ERROR_CONTAINS(load_edited("kimi_k3", vision([](auto& v) { v["norm_type"] = "batch"; })),
                        "'norm_type'", "rmsnorm or layernorm");
  EXPECT_ERROR_CONTAINS(
      load_edited("kimi_k3", vision([](auto& v) { v["mm_projector_type"] = "mlp"; })),
      "'mm_projector_type'", "patchmergerv2");
  EXPECT_ERROR_CONTAINS(
      load_edited("kimi_k3", vision([](auto& v) { v["pos_emb_interpolation_mode"] = "area"; })),
      "'pos_emb_interpolation_mode'");
  EXPECT_ERROR_CONTAINS(load_edited("kimi_k3", vision([](auto& v) { v["text_hidden_size"] = 65; })),
                        "'text_hidden_size'", "hidden_size 64");
  LoadedModel m = model_load(fixture_dir("kimi_k3"), {});
  EXPECT_EQ(m.report.tensors_not_wanted, 0);  // the tower's tensors are read
  EXPECT_NE(m.model->vision_encoder(), nullptr);
  // Layers 0, 1, 3, 4 are KDA: three conv states and a [2, 16, 16] state each.
  EXPECT_EQ(m.model->state_specs().size(), 16u);
  LoadedModel t = model_load(fixture_dir("kimi_k3_mxfp4"), {});
  EXPECT_EQ(t.report.tensors_not_wanted, 2);  // vision_tower.*, mm_projector.* skipped
  EXPECT_EQ(t.model->vision_encoder(), nullptr);
}

}  // namespace
}  // namespace atom::test
