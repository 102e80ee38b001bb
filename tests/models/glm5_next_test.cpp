// GLM-5.3 (Glm5Next) beyond the parity fixture: bad fields are errors naming them, the vision tower
// is never read, and the config's head_dim of 0 (its RoPE width) is accepted.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "engine/sequence_runner.h"
#include "loader/hf_config.h"
#include "models/loading.h"

namespace atom::test {
namespace {

void load_glm5_edited(const std::function<void(nlohmann::json&)>& edit) {
  TempDir d;
  copy_dir(fixture_dir("glm5_next"), d.str());
  nlohmann::json c = json_load_file(d.file("config.json"));
  edit(c["text_config"]);
  write_file(d.file("config.json"), c.dump());
  model_load(d.str(), {});
}

TEST(Glm5Next, BadFieldsAreErrorsNamingThem) {
  EXPECT_ERROR_CONTAINS(load_glm5_edited([](auto& t) { t["qk_rope_head_dim"] = 8; }),
                        "'qk_rope_head_dim'", "must be 0");
  EXPECT_ERROR_CONTAINS(load_glm5_edited([](auto& t) { t["index_topk"] = 10; }), "'index_topk'",
                        "multiple of index_kpool (4)");
  EXPECT_ERROR_CONTAINS(load_glm5_edited([](auto& t) { t["num_key_value_heads"] = 2; }),
                        "'num_key_value_heads'", "must equal num_attention_heads (4)");
  // Layer 3 is KDA: a shared sparse layer after it would have no selection to reuse.
  EXPECT_ERROR_CONTAINS(load_glm5_edited([](auto& t) {
                          t["layer_types"] = {"linear_attention", "deepseek_sparse_attention",
                                              "linear_attention", "deepseek_sparse_attention"};
                          t["indexer_types"] = {"full", "full", "full", "shared"};
                        }),
                        "'indexer_types'", "layer 3 is 'shared' but layer 2");
  EXPECT_ERROR_CONTAINS(load_glm5_edited([](auto& t) { t["layer_types"][0] = "mamba"; }),
                        "'layer_types'", "'mamba'");
  // An FP8 KV cache on the CPU: the k-pool plane refuses it by name.
  LoadedModel m = model_load(fixture_dir("glm5_next"), {});
  EXPECT_ERROR_CONTAINS(score_tokens(*m.model, {5, 6, 7}, 0, 16, DType::kF8E4M3), "k-pool indexer",
                        "F32");
}

TEST(Glm5Next, VisionTowerIsSkippedUnread) {
  LoadedModel m = model_load(fixture_dir("glm5_next"), {});
  for (const auto& [name, p] : m.model->params().all())
    EXPECT_EQ(name.find("visual"), std::string::npos) << name;
  EXPECT_GT(m.report.tensors_not_wanted, 0) << "the fixture's vision tower should be skipped";
  EXPECT_EQ(model_config_load(fixture_dir("glm5_next")).head_dim, 0);
}

}  // namespace
}  // namespace atom::test
