// --kv-cache-dtype (vLLM's values): parsing and refusals, KV sizing at 1 byte per element, and the
// CPU engine with an FP8 (e4m3) cache against transformers' fp32 fixtures: logits within 6e-2
// (normalised) and at e4m3's precision relative to a BF16 cache, greedy tokens equal up to the
// first step whose reference margin is within the FP8 cache's noise.
#include <cstdio>
#include <filesystem>

#include "common/test_util.h"
#include "engine_test_util.h"
#include "loader/safetensors.h"

namespace atom::test {
namespace {

void expect_flag_error(const std::string& value) {
  try {
    kv_cache_dtype_parse(value);
    FAIL() << "'" << value << "' accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-cache-dtype"), std::string::npos) << e.what();
  }
}

TEST(KvCacheDtype, ParsesVllmNamesAndRefusesOthers) {
  EXPECT_EQ(kv_cache_dtype_parse("auto"), std::nullopt);
  EXPECT_EQ(kv_cache_dtype_parse("fp8"), DType::kF8E4M3);
  EXPECT_EQ(kv_cache_dtype_parse("fp8_e4m3"), DType::kF8E4M3);
  EXPECT_EQ(kv_cache_dtype_parse("bf16"), DType::kBF16);
  EXPECT_EQ(kv_cache_dtype_parse("bfloat16"), DType::kBF16);
  for (const char* bad : {"fp8_e5m2", "FP8", "float16", "", "int8"}) expect_flag_error(bad);
  EngineConfig c = test_config();
  c.kv_cache_dtype = "fp9";
  EXPECT_THROW(kv_cache_plan(fixture_model("llama3_gqa"), c), Error);
}

TEST(KvCacheDtype, OneBytePerElementFitsFourTimesTheF32Blocks) {
  Model& model = fixture_model("llama3_gqa");
  EngineConfig c = test_config();
  const KvCachePlan f32 = kv_cache_plan(model, c);
  EXPECT_EQ(f32.kv_cache_dtype, DType::kF32);  // auto: the CPU's activations
  c.kv_cache_memory = 40 * static_cast<int64_t>(f32.block_bytes);
  const KvCachePlan small = kv_cache_plan(model, c);
  c.kv_cache_dtype = "fp8";
  const KvCachePlan fp8 = kv_cache_plan(model, c);
  c.kv_cache_dtype = "bfloat16";
  const KvCachePlan bf16 = kv_cache_plan(model, c);
  EXPECT_EQ(fp8.kv_cache_dtype, DType::kF8E4M3);
  EXPECT_EQ(bf16.kv_cache_dtype, DType::kBF16);
  EXPECT_EQ(fp8.block_bytes * 4, f32.block_bytes);
  EXPECT_EQ(bf16.block_bytes * 2, f32.block_bytes);
  EXPECT_EQ(small.num_blocks, 40);
  EXPECT_EQ(fp8.num_blocks, 160);
  EXPECT_EQ(bf16.num_blocks, 80);
  // The engine's runner allocates what the plan counted.
  c.kv_cache_dtype = "fp8";
  LLMEngine engine(model, c);
  EXPECT_EQ(engine.block_manager().num_blocks(), 160);
}

// atom reads no checkpoint KV scales: a checkpoint carrying them (vLLM's `*.k_scale` /
// `*.v_scale`) is refused, naming the tensors, rather than served with scales of 1.
TEST(KvCacheDtype, CheckpointKvScalesAreRefusedNotIgnored) {
  TempDir dir;
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(fixture_dir("llama3_gqa") + "/" + f, dir.file(f));
  Tensor one = Tensor::empty({}, DType::kF32);
  one.ptr<float>()[0] = 1.0f;
  safetensors_write(dir.file("kv_scales.safetensors"), {{"model.layers.0.self_attn.k_scale", one},
                                                        {"model.layers.0.self_attn.v_scale", one}});
  try {
    model_load(dir.str(), ModelOptions{});
    FAIL() << "a checkpoint with KV-cache scales was loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.self_attn.k_scale"), std::string::npos)
        << e.what();
  }
}

class KvCacheFp8Fixture : public ::testing::TestWithParam<std::string> {};

TEST_P(KvCacheFp8Fixture, EngineStaysCloseToTransformers) {
  const Reference ref = reference_load(GetParam());
  Model& model = fixture_model(GetParam());
  Tensor fp8 = score_tokens(model, ref.input_ids, 0, 16, DType::kF8E4M3);
  const double err = rel_err(fp8, ref.logits);
  const float dmax = max_abs_diff(fp8, ref.logits);
  const double err_bf16 =
      rel_err(score_tokens(model, ref.input_ids, 0, 16, DType::kBF16), ref.logits);
  std::printf(
      "%s: vs transformers fp32: fp8 KV cache rel err %.3g (max |dlogit| %.3g), bf16 cache %.3g, "
      "f32 cache %.3g\n",
      GetParam().c_str(), err, dmax, err_bf16,
      rel_err(score_tokens(model, ref.input_ids), ref.logits));
  // These fixtures (3 layers, head_dim 16, random weights) are sensitive: measured 3.6-4.8e-2,
  // about 16x the BF16 cache's error, as e4m3's 3 mantissa bits against bf16's 7 predict.
  EXPECT_LE(err, 6e-2) << GetParam();
  EXPECT_GT(err, 4 * err_bf16) << "not quantised to e4m3's precision";
  EXPECT_LT(err, 30 * err_bf16) << "coarser than e4m3 rounding";
  // Chunked prefill over small pages, and token-by-token decode, read the same FP8 cache.
  EXPECT_LE(rel_err(score_tokens(model, ref.input_ids, 7, 4, DType::kF8E4M3), fp8), 1e-2);
  EXPECT_LE(rel_err(score_tokens(model, ref.input_ids, 1, 16, DType::kF8E4M3), fp8), 1e-2);

  // Greedy through the engine: equal up to the first step whose reference margin is within the
  // FP8 noise (twice the largest logit error seen above).
  EngineConfig c = test_config();
  c.kv_cache_dtype = "fp8";
  LLMEngine engine(model, c);
  const auto out =
      engine.generate({ref.greedy_prompt}, greedy(static_cast<int>(ref.greedy_tokens.size())));
  const auto& tokens = out.at(0).outputs.at(0).token_ids;
  ASSERT_EQ(tokens.size(), ref.greedy_tokens.size());
  const size_t i =
      expect_greedy_agrees(GetParam(), tokens, ref.greedy_tokens, std::max(0.05f, 2.0f * dmax));
  std::printf("%s: fp8 greedy tokens agree for %zu of %zu steps\n", GetParam().c_str(), i,
              tokens.size());
  expect_engine_idle(engine);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvCacheFp8Fixture, ::testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace atom::test
