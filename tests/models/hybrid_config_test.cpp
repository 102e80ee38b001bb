// Hybrid (Gated DeltaNet) configs and checkpoints: a bad field is an error naming it, before any
// weight is read; the vision tower and MTP tensors of the checkpoints are skipped unread; the
// state each linear-attention layer declares for the slot pool has the shapes of its config.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "common/fixtures.h"
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

}  // namespace
}  // namespace atom::test
