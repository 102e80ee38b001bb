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
