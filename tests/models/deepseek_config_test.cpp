// DeepSeek-family configs: a bad or unsupported field is an error naming it, before any weight is
// read; the MTP layer's tensors are skipped; dummy weights need config.json alone.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "engine/sequence_runner.h"
#include "loader/hf_config.h"
#include "loader/safetensors.h"
#include "models/loading.h"

namespace atom::test {
namespace {

// Loads fixture `name` with its config.json edited by `edit`.
void load_edited(const std::string& name, const std::function<void(nlohmann::json&)>& edit,
                 LoadFormat format = LoadFormat::kAuto) {
  TempDir d;
  copy_dir(fixture_dir(name), d.str());
  nlohmann::json c = json_load_file(d.file("config.json"));
  edit(c);
  write_file(d.file("config.json"), c.dump());
  model_load(d.str(), {}, format);
}

TEST(DeepseekConfig, BadFieldsAreErrorsNamingThem) {
  EXPECT_ERROR_CONTAINS(load_edited("deepseek_v2", [](auto& c) { c["topk_method"] = "noaux_tc"; }),
                        "'topk_method'", "noaux_tc");
  EXPECT_ERROR_CONTAINS(load_edited("deepseek_v2", [](auto& c) { c.erase("n_group"); }),
                        "'n_group'", "missing");
  EXPECT_ERROR_CONTAINS(load_edited("deepseek_v3", [](auto& c) { c["n_group"] = 3; }), "'n_group'",
                        "must divide n_routed_experts (16)");
  EXPECT_ERROR_CONTAINS(load_edited("deepseek_v3", [](auto& c) { c["topk_group"] = 5; }),
                        "'topk_group'", "n_group = 4");
  EXPECT_ERROR_CONTAINS(load_edited("deepseek_v3", [](auto& c) { c["q_lora_rank"] = 0; }),
                        "'q_lora_rank'");
  EXPECT_ERROR_CONTAINS(load_edited("deepseek_v3", [](auto& c) { c["qk_rope_head_dim"] = 7; }),
                        "'qk_rope_head_dim'", "even");
  EXPECT_ERROR_CONTAINS(load_edited("deepseek_v3", [](auto& c) { c["kv_lora_rank"] = -1; }),
                        "'kv_lora_rank'");
  EXPECT_ERROR_CONTAINS(load_edited("deepseek_v3", [](auto& c) { c["num_experts_per_tok"] = 17; }),
                        "'num_experts_per_tok'", "[1, 16]");
  EXPECT_ERROR_CONTAINS(load_edited("deepseek_v3_plain", [](auto& c) { c["hidden_act"] = "gelu"; }),
                        "'hidden_act'", "gelu");
  EXPECT_ERROR_CONTAINS(load_edited("deepseek_v2_lite", [](auto& c) { c["mlp_bias"] = true; }),
                        "'mlp_bias'");
  EXPECT_ERROR_CONTAINS(
      load_edited("deepseek_v3",
                  [](auto& c) { c["rope_parameters"]["partial_rotary_factor"] = 0.5; }),
      "'partial_rotary_factor'");
}

TEST(DeepseekConfig, SparseAttentionFieldsAreChecked) {
  EXPECT_ERROR_CONTAINS(load_edited("glm_moe_dsa",
                                    [](auto& c) {
                                      c["indexer_types"] = {"shared", "full", "full"};
                                    }),
                        "'indexer_types'", "must start with a 'full' layer");
  EXPECT_ERROR_CONTAINS(load_edited("glm_moe_dsa",
                                    [](auto& c) {
                                      c["indexer_types"] = {"full", "sparse", "full"};
                                    }),
                        "'indexer_types'", "'sparse'");
  EXPECT_ERROR_CONTAINS(load_edited("glm_moe_dsa",
                                    [](auto& c) {
                                      c.erase("indexer_types");
                                      c["index_topk_pattern"] = "FSX";
                                    }),
                        "'index_topk_pattern'");
  EXPECT_ERROR_CONTAINS(load_edited("deepseek_v32", [](auto& c) { c["q_lora_rank"] = nullptr; }),
                        "'q_lora_rank'", "indexer");
  EXPECT_ERROR_CONTAINS(load_edited("deepseek_v32", [](auto& c) { c["index_head_dim"] = 4; }),
                        "'index_head_dim'");
  EXPECT_ERROR_CONTAINS(load_edited("deepseek_v32",
                                    [](auto& c) {
                                      c["mlp_layer_types"] = {"dense", "moe", "sparse"};
                                    }),
                        "'mlp_layer_types'", "'moe'");
  // A pattern in place of the list derives the same layers (layer 1 shared: no indexer there).
  TempDir d;
  copy_dir(fixture_dir("glm_moe_dsa"), d.str());
  nlohmann::json c = json_load_file(d.file("config.json"));
  c.erase("indexer_types");
  c["index_topk_pattern"] = "FSF";
  write_file(d.file("config.json"), c.dump());
  const Reference ref = reference_load("glm_moe_dsa");
  LoadedModel m = model_load(d.str(), {});
  EXPECT_EQ(m.model->params().find("model.layers.1.self_attn.indexer.wk.weight"), nullptr);
  EXPECT_LE(max_abs_diff(score_tokens(*m.model, ref.input_ids), ref.logits), 1e-4f);
}

// The official checkpoints are FP8 (weight_scale_inv; the deepseek_v3_fp8 fixtures): a config
// saying so over BF16 weights is refused naming a weight that is not FP8.
TEST(DeepseekConfig, Fp8ConfigOverBf16WeightsIsRefusedByName) {
  EXPECT_ERROR_CONTAINS(
      load_edited(
          "deepseek_v3",
          [](auto& c) {
            c["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
          }),
      "as FP8, but the checkpoint weight is BF16", "not F8_E4M3");
}

// The fixture's MTP layer (model.layers.3.*: a whole decoder layer plus enorm, hnorm, eh_proj,
// shared_head) is not part of the target model: a load skips it without complaint, and a
// checkpoint holding a stray tensor of a real layer still fails naming it.
TEST(DeepseekConfig, MtpLayerIsSkippedAndStrayTensorsAreNot) {
  LoadedModel m = model_load(fixture_dir("deepseek_v3"), {});
  for (const auto& [name, p] : m.model->params().all())
    EXPECT_EQ(name.find("model.layers.3."), std::string::npos) << name;
  TempDir d;
  copy_dir(fixture_dir("deepseek_v3"), d.str());
  Tensor t = Tensor::zeros({4}, DType::kBF16);
  safetensors_write(d.file("extra.safetensors"), {{"model.layers.1.self_attn.k_proj.weight", t}});
  EXPECT_ERROR_CONTAINS(model_load(d.str(), {}), "model.layers.1.self_attn.k_proj.weight");
}

TEST(DeepseekConfig, DummyWeightsFromConfigAlone) {
  for (const std::string name : {"deepseek_v2_lite", "deepseek_v3"}) {
    TempDir d;
    copy_dir(fixture_dir(name), d.str());
    for (const auto& e : std::filesystem::directory_iterator(d.path()))
      if (e.path().extension() == ".safetensors") std::filesystem::remove(e.path());
    LoadedModel m = model_load(d.str(), {}, LoadFormat::kDummy);
    Tensor logits = score_tokens(*m.model, {5, 17, 300, 42, 7});
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < logits.numel(); ++i) {
      ASSERT_TRUE(std::isfinite(logits.ptr<float>()[i])) << name;
      lo = std::min(lo, logits.ptr<float>()[i]);
      hi = std::max(hi, logits.ptr<float>()[i]);
    }
    EXPECT_GT(hi - lo, 1e-3f) << name;
  }
}

}  // namespace
}  // namespace atom::test
