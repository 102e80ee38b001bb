// Name rewriting, packed-module dispatch and coverage: what happens to every checkpoint tensor,
// and the errors for a parameter that received nothing or a tensor nobody claimed.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "engine/sequence_runner.h"
#include "loader/weight_names.h"
#include "models/loading.h"

namespace atom::test {
namespace {

TEST(WeightNames, LayerIndex) {
  EXPECT_EQ(weight_name_layer_index("model.layers.12.mlp.up_proj.weight"), 12);
  EXPECT_EQ(weight_name_layer_index("layers.3.attn"), 3);
  EXPECT_EQ(weight_name_layer_index("model.norm.weight"), -1);
  EXPECT_EQ(weight_name_layer_index("model.mylayers.4.x"), -1);
  EXPECT_EQ(weight_name_layer_index("model.language_model.layers.7.x"), 7);
}

TEST(WeightNames, ComponentReplaceDoesNotMatchInsideOtherNames) {
  EXPECT_EQ(
      weight_name_replace_component("model.layers.0.mlp.up_proj.weight", "up_proj", "gate_up_proj"),
      "model.layers.0.mlp.gate_up_proj.weight");
  EXPECT_FALSE(
      weight_name_replace_component("model.layers.0.mlp.gate_up_proj.weight", "up_proj", "x"));
  EXPECT_FALSE(weight_name_replace_component("model.layers.0.q_a_proj.weight", "q_proj", "x"));
}

TEST(WeightNames, MapperPrefixSubstringSuffixAndDrop) {
  WeightsMapper m;
  m.prefix = {{"mtp.", "model."}};
  m.substr = {{".gate_up_proj_blocks", ".w13_weight"}, {".junk.", std::nullopt}};
  m.suffix = {{".scales", ".weight_scale"}};
  EXPECT_EQ(*m.apply("mtp.layers.0.x"), "model.layers.0.x");
  EXPECT_EQ(*m.apply("model.layers.0.mlp.experts.gate_up_proj_blocks"),
            "model.layers.0.mlp.experts.w13_weight");
  EXPECT_EQ(*m.apply("a.b.scales"), "a.b.weight_scale");
  EXPECT_FALSE(m.apply("a.junk.b"));
}

TEST(WeightNames, RewriterScaleRenameAndLayersPastTheModel) {
  CheckpointNameRewriter r(4, {});
  EXPECT_EQ(*r.rewrite("model.layers.1.self_attn.q_proj.weight_scale_inv"),
            "model.layers.1.self_attn.q_proj.weight_scale");
  EXPECT_EQ(*r.rewrite("model.layers.3.mlp.down_proj.weight"),
            "model.layers.3.mlp.down_proj.weight");
  EXPECT_FALSE(r.rewrite("model.layers.4.enorm.weight"));  // an MTP layer: not for the target
  // A drafter load takes layers >= num_hidden_layers through its own rewrite.
  CheckpointNameRewriter drafter(4, {}, true, [](const std::string& n, int64_t layer) {
    return std::optional<std::string>("mtp." + std::to_string(layer - 4) + n.substr(n.rfind('.')));
  });
  EXPECT_EQ(*drafter.rewrite("model.layers.4.enorm.weight"), "mtp.0.weight");
}

// Rewrites one tensor file of a copied fixture through `edit`.
void edit_tensors(const std::string& path,
                  const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
  std::vector<std::pair<std::string, Tensor>> ts;
  {
    SafetensorsFile f(path, false);
    for (const auto& e : f.header().entries) ts.emplace_back(e.name, f.tensor(e).clone());
  }
  edit(ts);
  safetensors_write(path, ts);
}

class Coverage : public ::testing::Test {
 protected:
  TempDir d;
  void SetUp() override { copy_dir(fixture_dir("qwen3_tied"), d.str()); }
  std::string weights() const { return d.file("model.safetensors"); }
};

TEST_F(Coverage, MissingTensorNamesTheParameter) {
  edit_tensors(weights(), [](auto& ts) {
    std::erase_if(ts, [](auto& p) { return p.first == "model.layers.1.mlp.down_proj.weight"; });
  });
  EXPECT_ERROR_CONTAINS(model_load(d.str(), {}), "model.layers.1.mlp.down_proj.weight",
                        "received no data");
}

TEST_F(Coverage, MissingPartOfAFusedParameter) {
  edit_tensors(weights(), [](auto& ts) {
    std::erase_if(ts, [](auto& p) { return p.first == "model.layers.2.self_attn.k_proj.weight"; });
  });
  EXPECT_ERROR_CONTAINS(model_load(d.str(), {}), "model.layers.2.self_attn.qkv_proj.weight",
                        "part k");
}

TEST_F(Coverage, UnclaimedTensorIsAnError) {
  edit_tensors(weights(), [](auto& ts) {
    ts.emplace_back("model.layers.0.self_attn.mystery.weight", Tensor::zeros({4}, DType::kBF16));
  });
  EXPECT_ERROR_CONTAINS(model_load(d.str(), {}), "model.layers.0.self_attn.mystery.weight",
                        "match no parameter");
}

TEST_F(Coverage, DeclaredIgnorableTensorsAreAccepted) {
  edit_tensors(weights(), [](auto& ts) {
    ts.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq",
                    Tensor::zeros({16}, DType::kF32));
    // Tied embeddings: a stored lm_head is redundant.
    SafetensorsFile f(fixture_dir("qwen3_tied") + "/model.safetensors", false);
    ts.emplace_back("lm_head.weight", f.tensor("model.embed_tokens.weight").clone());
  });
  LoadedModel m = model_load(d.str(), {});
  EXPECT_EQ(m.report.tensors_ignored, 2);
  const Reference ref = reference_load("qwen3_tied");
  expect_logits_near(score_tokens(*m.model, ref.input_ids), ref.logits, kCpuLogitTolerance,
                     "with ignorable tensors");
}

TEST_F(Coverage, LayersPastTheModelAreSkipped) {
  edit_tensors(weights(), [](auto& ts) {
    ts.emplace_back("model.layers.3.eh_proj.weight", Tensor::zeros({4, 4}, DType::kBF16));
    ts.emplace_back("model.layers.3.self_attn.q_proj.weight", Tensor::zeros({4, 4}, DType::kBF16));
  });
  LoadedModel m = model_load(d.str(), {});
  EXPECT_EQ(m.report.tensors_not_wanted, 2);
}

TEST_F(Coverage, ShapeMismatchNamesParameterAndShapes) {
  edit_tensors(weights(), [](auto& ts) {
    for (auto& [n, t] : ts)
      if (n == "model.norm.weight") t = Tensor::zeros({63}, DType::kBF16);
  });
  EXPECT_ERROR_CONTAINS(model_load(d.str(), {}), "model.norm.weight", "[63]", "[64]");
}

TEST_F(Coverage, QuantizedCheckpointOfAnUnsupportedMethodIsRefusedByName) {
  std::string cfg = read_file(d.file("config.json"));
  cfg.insert(cfg.rfind('}'), R"(, "quantization_config": {"quant_method": "gptq", "bits": 4})");
  write_file(d.file("config.json"), cfg);
  EXPECT_ERROR_CONTAINS(model_load(d.str(), {}), "quant_method 'gptq' is not supported",
                        "Qwen3ForCausalLM");
}

TEST_F(Coverage, DuplicateTensorAcrossFilesWithoutIndex) {
  std::vector<std::pair<std::string, Tensor>> one;
  {
    SafetensorsFile f(weights(), false);
    one.emplace_back("model.norm.weight", f.tensor("model.norm.weight").clone());
  }
  safetensors_write(d.file("extra.safetensors"), one);
  EXPECT_ERROR_CONTAINS(model_load(d.str(), {}), "model.norm.weight", "twice");
}

}  // namespace
}  // namespace atom::test

namespace atom::test {
namespace {

// Post-load processing runs once, after every parameter is filled, in registration order.
TEST(PostLoad, RunsAfterCoverageInOrder) {
  TempDir d;
  Tensor a = Tensor::empty({2, 2}, DType::kF32);
  for (int i = 0; i < 4; ++i) a.ptr<float>()[i] = static_cast<float>(i);
  safetensors_write(d.file("model.safetensors"), {{"a.weight", a}, {"b.weight", a}});
  ParamRegistry reg;
  Parameter& pa = reg.add("a.weight", Tensor::zeros({2, 2}, DType::kF32));
  reg.add("b.weight", Tensor::zeros({2, 2}, DType::kF32));
  std::vector<std::string> order;
  reg.add_post_load([&] {
    order.push_back("double a");
    for (int i = 0; i < 4; ++i) pa.data().ptr<float>()[i] *= 2;
  });
  reg.add_post_load([&] { order.push_back("second"); });
  WeightLoadSpec spec;
  spec.num_hidden_layers = 1;
  load_weights(reg, Checkpoint(d.str()), spec, CheckpointReadOptions{});
  EXPECT_EQ(order, (std::vector<std::string>{"double a", "second"}));
  EXPECT_EQ(pa.data().ptr<float>()[3], 6.0f);

  // Coverage fails first: no post-load step runs on half-loaded weights.
  ParamRegistry reg2;
  reg2.add("a.weight", Tensor::zeros({2, 2}, DType::kF32));
  reg2.add("b.weight", Tensor::zeros({2, 2}, DType::kF32));
  reg2.add("c.weight", Tensor::zeros({2, 2}, DType::kF32));
  bool ran = false;
  reg2.add_post_load([&] { ran = true; });
  EXPECT_ERROR_CONTAINS(load_weights(reg2, Checkpoint(d.str()), spec, CheckpointReadOptions{}),
                        "c.weight", "received no data");
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace atom::test
