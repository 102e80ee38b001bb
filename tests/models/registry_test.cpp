// The registry and --load-format dummy.
#include <gtest/gtest.h>

#include <cmath>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "engine/sequence_runner.h"
#include "models/loading.h"

namespace atom::test {
namespace {

TEST(Registry, KnowsLlamaAndQwen3) {
  const auto list = model_registry_list();
  EXPECT_NE(std::find(list.begin(), list.end(), "LlamaForCausalLM"), list.end());
  EXPECT_NE(std::find(list.begin(), list.end(), "Qwen3ForCausalLM"), list.end());
}

TEST(Registry, UnknownArchitectureListsTheSupportedOnes) {
  TempDir d;
  std::string cfg = read_file(fixture_dir("llama3_gqa") + "/config.json");
  cfg.replace(cfg.find("LlamaForCausalLM"), 16, "FancyNewForCausalLM");
  write_file(d.file("config.json"), cfg);
  EXPECT_ERROR_CONTAINS(model_load(d.str(), {}), "'FancyNewForCausalLM'", "LlamaForCausalLM",
                        "Qwen3ForCausalLM");
}

TEST(Registry, LoadFormatNames) {
  EXPECT_EQ(load_format_parse("dummy"), LoadFormat::kDummy);
  EXPECT_EQ(load_format_parse("auto"), LoadFormat::kAuto);
  EXPECT_ERROR_CONTAINS(load_format_parse("gguf"), "--load-format", "gguf");
}

// A dummy model needs config.json alone, is deterministic, and gives finite, non-flat logits.
TEST(DummyLoad, FromConfigAlone) {
  TempDir d;
  copy_dir(fixture_dir("qwen3_tied"), d.str());
  std::filesystem::remove(d.file("model.safetensors"));
  const std::vector<int32_t> ids = {5, 17, 300, 42, 7, 7, 99};
  LoadedModel a = model_load(d.str(), {}, LoadFormat::kDummy);
  LoadedModel b = model_load(d.str(), {}, LoadFormat::kDummy);
  Tensor la = score_tokens(*a.model, ids), lb = score_tokens(*b.model, ids);
  EXPECT_EQ(max_abs_diff(la, lb), 0.0f);
  float lo = 1e30f, hi = -1e30f;
  for (int64_t i = 0; i < la.numel(); ++i) {
    const float v = la.ptr<float>()[i];
    ASSERT_TRUE(std::isfinite(v));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_GT(hi - lo, 1e-3f);
  EXPECT_ERROR_CONTAINS(model_load(d.str(), {}), "no .safetensors");
}

}  // namespace
}  // namespace atom::test

namespace atom::test {
namespace {

// A checkpoint asking for an activation, rope type or layer type the model does not implement is
// refused by name before the model is built (they once ran as silu, default rope, full attention).
TEST(Registry, UnimplementedVariantsAreRefusedByName) {
  const std::string cfg_path = fixture_dir("qwen3_sliding") + "/config.json";
  struct Case {
    const char* patch;
    std::vector<std::string> want;
  };
  for (
      const Case& k : {
          Case{R"({"hidden_act": "relu_squared"})",
               {"'hidden_act'", "relu_squared", "Qwen3ForCausalLM", "silu"}},
          Case{R"({"hidden_act": "gelu"})", {"'hidden_act'", "gelu"}},
          // head_dim 0 parses (GLM-5.3 writes it) but a model that reads head_dim refuses it.
          Case{R"({"head_dim": 0})", {"'head_dim'", "must be positive for Qwen3ForCausalLM"}},
          Case{R"({"layer_types": ["bogus", "sliding_attention"]})",
               {"'layer_types'", "entry 0", "'bogus'", "sliding_attention"}},
          Case{
              R"({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "rope_parameters": null})",
              {"rope type 'dynamic'", "llama3, yarn"}},
      }) {
    TempDir d;
    copy_dir(fixture_dir("qwen3_sliding"), d.str());
    nlohmann::json j = nlohmann::json::parse(read_file(cfg_path));
    j.merge_patch(nlohmann::json::parse(k.patch));
    if (j.contains("layer_types")) j["num_hidden_layers"] = j["layer_types"].size();
    write_file(d.file("config.json"), j.dump());
    const std::string where = d.file("config.json");
    try {
      model_load(d.str(), {}, LoadFormat::kDummy);
      ADD_FAILURE() << "expected an error for " << k.patch;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(where), std::string::npos) << msg;
      for (const auto& w : k.want)
        EXPECT_NE(msg.find(w), std::string::npos) << w << " not in " << msg;
    }
  }
  // The same folder unpatched loads.
  EXPECT_NO_THROW(model_load(fixture_dir("qwen3_sliding"), {}, LoadFormat::kDummy));
  // DeepSeek V3 has no sliding-window layers.
  EXPECT_EQ(model_support("DeepseekV3ForCausalLM").layer_types,
            std::vector<std::string>{"full_attention"});
}

// A tensor stored as integers where the model reads floats: a sentence naming the tensor and the
// folder, not the internal check text ("convert.cpp:46: check failed: ...").
TEST(Registry, UnconvertibleCheckpointDtypeIsASentence) {
  TempDir d;
  copy_dir(fixture_dir("llama_linear_sharded_f32"), d.str());
  const std::string key = "\"model.norm.weight\":{\"dtype\":\"F32\"";
  bool found = false;
  for (const char* shard :
       {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    std::string st = read_file(d.file(shard));
    const size_t at = st.find(key);
    if (at == std::string::npos) continue;
    st.replace(at + key.size() - 4, 3, "I32");  // same length and size: the header stays valid
    write_file(d.file(shard), st);
    found = true;
  }
  ASSERT_TRUE(found);
  try {
    model_load(d.str(), {});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("model.norm.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find(d.str()), std::string::npos) << msg;
    EXPECT_NE(msg.find("stored as I32"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("check failed"), std::string::npos) << msg;
    EXPECT_EQ(msg.find(".cpp:"), std::string::npos) << msg;
  }
}

TEST(Registry, DuplicateArchitectureIsRefused) {
  EXPECT_ERROR_CONTAINS(model_registry_add("LlamaForCausalLM",
                                           [](const ModelConfig&, const ModelOptions&) {
                                             return std::unique_ptr<Model>();
                                           }),
                        "'LlamaForCausalLM'", "registered twice");
  // The first registration still stands.
  EXPECT_ERROR_CONTAINS(model_support("NoSuchForCausalLM"), "not registered");
  EXPECT_NO_THROW(model_support("LlamaForCausalLM"));
}

}  // namespace
}  // namespace atom::test
