// Parity with transformers: logits within kCpuLogitTolerance (3e-5; measured 0.9-1.6e-5; the
// hybrids: kHybridCpuLogitTolerance and kHybridCpuRelTolerance, tests/common/fixtures.h) and
// identical greedy tokens, per fixture, on the CPU reference backend; also with chunked prefill
// (every row, so NaN after the first chunk fails), without mmap, and sequential loading.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "engine/sequence_runner.h"
#include "common/fixtures.h"
#include "models/loading.h"

namespace atom::test {
namespace {

class Parity : public ::testing::TestWithParam<std::string> {};

// The spec's ATOM_ENABLE_QK_NORM_ROPE_CACHE_QUANT_FUSION (Qwen3, Qwen3-MoE): q_norm and k_norm
// inside the RoPE + cache-write kernel, or as their own kernel first: the same logits (on the
// CPU, where both are fp32), and both within transformers' parity bound.
TEST(Qwen3Switches, QkNormInsideRopeOrApartComputeTheSameLogits) {
  for (const char* name : {"qwen3_sliding", "qwen3_moe"}) {
    SCOPED_TRACE(name);
    const Reference ref = reference_load(name);
    auto logits_with = [&](const char* on) {
      setenv("ATOM_ENABLE_QK_NORM_ROPE_CACHE_QUANT_FUSION", on, 1);
      LoadedModel m = model_load(fixture_dir(name), ModelOptions{});
      unsetenv("ATOM_ENABLE_QK_NORM_ROPE_CACHE_QUANT_FUSION");
      return score_tokens(*m.model, ref.input_ids);
    };
    const Tensor fused = logits_with("1"), apart = logits_with("0");
    expect_cpu_parity(apart, ref.logits, name, name);
    const Tensor a = tensor_cast_cpu(fused, DType::kF32), b = tensor_cast_cpu(apart, DType::kF32);
    ASSERT_EQ(a.numel(), b.numel());
    float worst = 0.0f;
    for (int64_t i = 0; i < a.numel(); ++i)
      worst = std::max(worst, std::fabs(a.ptr<float>()[i] - b.ptr<float>()[i]));
    ASSERT_FALSE(std::isnan(worst));
    std::printf("%s: QK norm inside RoPE vs apart, max |dlogit| %.3g\n", name, worst);
    EXPECT_LE(worst, 1e-5f);
  }
}

TEST_P(Parity, LogitsMatchTransformers) {
  const Reference ref = reference_load(GetParam());
  LoadedModel m = model_load(fixture_dir(GetParam()), ModelOptions{});
  Tensor logits = score_tokens(*m.model, ref.input_ids);
  const float d = expect_cpu_parity(logits, ref.logits, GetParam(), GetParam());
  RecordProperty("max_abs_logit_diff", std::to_string(d));
  std::printf("%s: max |Δlogit| vs transformers = %.3g\n", GetParam().c_str(), d);
}

TEST_P(Parity, GreedyTokensMatchTransformers) {
  const Reference ref = reference_load(GetParam());
  LoadedModel m = model_load(fixture_dir(GetParam()), ModelOptions{});
  const GreedyResult r = generate_greedy(*m.model, ref.greedy_prompt,
                                         static_cast<int>(ref.greedy_tokens.size()), {}, true);
  EXPECT_EQ(r.token_ids, ref.greedy_tokens) << GetParam();
  // Teacher-forced, every step must agree too (no step is excused: fp32 against fp32).
  expect_forced_greedy_agrees(GetParam(), score_tokens(*m.model, greedy_sequence(ref)), 0.0f,
                              ref.greedy_tokens.size());
}

TEST_P(Parity, ChunkedPrefillMatches) {
  const Reference ref = reference_load(GetParam());
  LoadedModel m = model_load(fixture_dir(GetParam()), ModelOptions{});
  // Chunks of 5 straddle the 16-token pages and the sliding windows.
  Tensor logits = score_tokens(*m.model, ref.input_ids, /*chunk=*/5, /*block_size=*/16);
  const float d5 = expect_cpu_parity(logits, ref.logits, GetParam(), GetParam() + ", chunks of 5");
  Tensor small_pages = score_tokens(*m.model, ref.input_ids, /*chunk=*/7, /*block_size=*/4);
  const float d7 = expect_cpu_parity(small_pages, ref.logits, GetParam(),
                                     GetParam() + ", chunks of 7 over pages of 4");
  std::printf("%s: chunked prefill max |Δlogit| %.3g, %.3g\n", GetParam().c_str(), d5, d7);
}

TEST_P(Parity, PlainReadsAndSequentialLoadingGiveTheSameWeights) {
  const Reference ref = reference_load(GetParam());
  setenv("ATOM_DISABLE_MMAP", "true", 1);
  setenv("ATOM_LOADER_NUM_THREADS", "1", 1);
  LoadedModel m = model_load(fixture_dir(GetParam()), ModelOptions{});
  unsetenv("ATOM_DISABLE_MMAP");
  unsetenv("ATOM_LOADER_NUM_THREADS");
  Tensor logits = score_tokens(*m.model, ref.input_ids);
  expect_cpu_parity(logits, ref.logits, GetParam(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity, ::testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace atom::test
