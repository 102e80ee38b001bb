// --kv-cache-dtype (vLLM's values): parsing and refusals, KV sizing at 1 byte per element, and the
// CPU engine with an FP8 (e4m3) cache against transformers' fp32 fixtures: logits within 8e-2
// (normalised) and at e4m3's precision relative to a BF16 cache, greedy steps teacher-forced and
// free-running against a noise level measured from the FP8 cache's own margin errors.
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

// DeepSeek-V4's row planes are read in the activation dtype only: another KV cache dtype is
// refused before anything is allocated, naming the model (it failed at the first forward, inside
// the compressor, before).
TEST(KvCacheDtype, RowPlanesRefuseAnotherDtypeNamingTheModel) {
  Model& model = fixture_model("deepseek_v4");
  EngineConfig c = test_config();
  c.kv_cache_dtype = "fp8";
  try {
    kv_cache_plan(model, c);
    ADD_FAILURE() << "fp8 accepted for DeepSeek-V4's row planes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DeepseekV4ForCausalLM"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--kv-cache-dtype fp8"), std::string::npos) << e.what();
  }
  c.kv_cache_dtype = "auto";
  EXPECT_EQ(kv_cache_plan(model, c).kv_cache_dtype, DType::kF32);
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
  const std::string name = GetParam();
  const Reference ref = reference_load(name);
  Model& model = fixture_model(name);
  const DType f8 = DType::kF8E4M3;
  Tensor fp8 = score_tokens(model, ref.input_ids, 0, 16, f8);
  const double err = rel_err(fp8, ref.logits, name);
  const float dmax = max_abs_diff(fp8, ref.logits, name);
  const float margin_err = max_margin_error(fp8, ref.logits);
  const double err_bf16 =
      rel_err(score_tokens(model, ref.input_ids, 0, 16, DType::kBF16), ref.logits, name);
  const double err_f32 = rel_err(score_tokens(model, ref.input_ids), ref.logits, name);
  const double err_chunked = rel_err(score_tokens(model, ref.input_ids, 7, 4, f8), fp8, name);
  const double err_decode = rel_err(score_tokens(model, ref.input_ids, 1, 16, f8), fp8, name);
  std::printf(
      "%s: vs transformers fp32: fp8 KV cache rel err %.3g (max |dlogit| %.3g, top-2 margin error "
      "%.3g), bf16 cache %.3g, f32 cache %.3g; fp8 chunked and token by token against whole "
      "prefill: %.3g, %.3g\n",
      name.c_str(), err, dmax, margin_err, err_bf16, err_f32, err_chunked, err_decode);
  // Measured on the fixtures (3 layers, head_dim 16-32, random weights): 4.0-6.5e-2, 15-19x the
  // BF16 cache's error, as e4m3's 3 mantissa bits against bf16's 7 predict (2^4 = 16).
  EXPECT_LE(err, 8e-2) << name;
  EXPECT_GT(err, 10 * err_bf16) << "not quantised to e4m3's precision";
  EXPECT_LT(err, 25 * err_bf16) << "coarser than e4m3 rounding";
  // Chunked prefill over small pages, and token-by-token decode, read the same FP8 cache: the
  // CPU computes every row's K and V the same way whatever the chunk, so the codes are equal.
  EXPECT_LE(err_chunked, 1e-5) << name;
  EXPECT_LE(err_decode, 1e-5) << name;

  // Greedy. The FP8 cache moves logits by up to ~1 here, so a step whose reference margin is small
  // may flip, and a free-running run diverges for good after its first flip. The test therefore
  //  1. takes the noise level from a measurement: twice the largest error of the reference's
  //     top-2 margin over the fixture's scored rows (the error of that difference is what flips a
  //     choice; on the greedy rows it was measured at 0.3-1.2x the scored rows' value, so twice
  //     covers them);
  //  2. checks every greedy step teacher-forced (the reference's tokens as context, decoded token
  //     by token through the FP8 cache as the engine does): each step whose reference margin is
  //     above the noise must choose the reference token, and at least 12 of the 16 must (measured:
  //     13-16; an FP8 path off by a scale flips most of them);
  //  3. runs the engine free: it must reproduce the teacher-forced run's leading agreeing steps
  //     (same context, same cache codes) and, where it first differs, the reference margin must
  //     be below the noise.
  const float noise = 2.0f * margin_err;
  const ForcedGreedy forced = expect_forced_greedy_agrees(
      name, score_tokens(model, greedy_sequence(ref), 1, 16, f8), noise, 12);
  EngineConfig c = test_config();
  c.kv_cache_dtype = "fp8";
  LLMEngine engine(model, c);
  const auto out =
      engine.generate({ref.greedy_prompt}, greedy(static_cast<int>(ref.greedy_tokens.size())));
  const auto& tokens = out.at(0).outputs.at(0).token_ids;
  expect_greedy_agrees(name, tokens, ref.greedy_tokens, noise, forced.leading);
  // And the single-sequence runner, which shares no scheduling or batching code, draws the same.
  EXPECT_EQ(
      generate_greedy(model, ref.greedy_prompt, static_cast<int>(tokens.size()), {}, true, 16, f8)
          .token_ids,
      tokens);
  expect_engine_idle(engine);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvCacheFp8Fixture, ::testing::ValuesIn(dense_fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace atom::test

namespace atom::test {
namespace {

// Cache slots are block * block_size + offset in int32: an override past that would wrap them.
TEST(KvCachePlan, BlockOverrideBeyondInt32SlotsIsRefused) {
  Model& model = fixture_model("llama3_gqa");
  EngineConfig c = test_config();
  c.block_size = 16;
  c.num_gpu_blocks_override = INT32_MAX / 16 + 1;
  EXPECT_ERROR_CONTAINS(kv_cache_plan(model, c), "--num-gpu-blocks-override", "32-bit",
                        std::to_string(INT32_MAX / 16));
  c.num_gpu_blocks_override = 1000;
  EXPECT_EQ(kv_cache_plan(model, c).num_blocks, 1000);
}

}  // namespace
}  // namespace atom::test
