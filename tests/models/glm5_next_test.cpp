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
}

// An FP8 (e4m3) KV cache: the latent plane holds e4m3 codes; the k-pool indexer's plane (keys and
// gate scores) keeps the activation dtype (CacheSpec::keeps_dtype). Measured on the fixture:
// 0.137 relative against transformers with the bf16 cache at 3.4e-3 (e4m3 on the indexer's plane
// too: 0.32, the gates' rounding moving the selection). The dense fixtures measure 4.0-6.5e-2
// (tests/engine/kv_cache_dtype_test.cpp); this one's 32-wide latents, shared by every head, have
// no rope part and pass through four hyper-connected streams.
TEST(Glm5Next, Fp8KvCacheStaysNearTheReference) {
  const Reference ref = reference_load("glm5_next");
  LoadedModel m = model_load(fixture_dir("glm5_next"), {});
  const double err =
      rel_err(score_tokens(*m.model, ref.input_ids, 0, 16, DType::kF8E4M3), ref.logits);
  const double err_bf16 =
      rel_err(score_tokens(*m.model, ref.input_ids, 0, 16, DType::kBF16), ref.logits);
  std::printf("glm5_next: vs transformers fp32: fp8 KV cache rel err %.3g, bf16 cache %.3g\n", err,
              err_bf16);
  EXPECT_LE(err, 0.2);
  EXPECT_GT(err, 10 * err_bf16) << "not quantised to e4m3's precision";
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
