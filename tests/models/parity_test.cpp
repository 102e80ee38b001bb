// Parity with transformers: logits within 1e-3 and identical greedy tokens, per fixture, on the
// CPU reference backend; also with chunked prefill, without mmap, and sequential loading.
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

constexpr float kTolerance = 1e-3f;
constexpr float kMlaTolerance = 1e-4f;

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, LogitsMatchTransformers) {
  const Reference ref = reference_load(GetParam());
  LoadedModel m = model_load(fixture_dir(GetParam()), ModelOptions{});
  Tensor logits = score_tokens(*m.model, ref.input_ids);
  ASSERT_EQ(logits.shape(), ref.logits.shape());
  const float d = max_abs_diff(logits, ref.logits);
  EXPECT_LE(d, kTolerance) << GetParam() << ": max |Δlogit| = " << d;
  // Multi-head latent attention computes the absorbed form (W_UK into the query, W_UV after
  // attention) where transformers expands K and V: the same values to fp32 rounding.
  const auto& mla = mla_fixture_names();
  if (std::find(mla.begin(), mla.end(), GetParam()) != mla.end()) {
    EXPECT_LE(d, kMlaTolerance) << GetParam() << ": max |Δlogit| = " << d;
  }
  RecordProperty("max_abs_logit_diff", std::to_string(d));
  std::printf("%s: max |Δlogit| vs transformers = %.3g\n", GetParam().c_str(), d);
}

TEST_P(Parity, GreedyTokensMatchTransformers) {
  const Reference ref = reference_load(GetParam());
  LoadedModel m = model_load(fixture_dir(GetParam()), ModelOptions{});
  const GreedyResult r = generate_greedy(*m.model, ref.greedy_prompt,
                                         static_cast<int>(ref.greedy_tokens.size()), {}, true);
  EXPECT_EQ(r.token_ids, ref.greedy_tokens) << GetParam();
}

TEST_P(Parity, ChunkedPrefillMatches) {
  const Reference ref = reference_load(GetParam());
  LoadedModel m = model_load(fixture_dir(GetParam()), ModelOptions{});
  // Chunks of 5 straddle the 16-token pages and the sliding windows.
  Tensor logits = score_tokens(*m.model, ref.input_ids, /*chunk=*/5, /*block_size=*/16);
  EXPECT_LE(max_abs_diff(logits, ref.logits), kTolerance);
  Tensor small_pages = score_tokens(*m.model, ref.input_ids, /*chunk=*/7, /*block_size=*/4);
  EXPECT_LE(max_abs_diff(small_pages, ref.logits), kTolerance);
}

TEST_P(Parity, PlainReadsAndSequentialLoadingGiveTheSameWeights) {
  const Reference ref = reference_load(GetParam());
  setenv("ATOM_DISABLE_MMAP", "true", 1);
  setenv("ATOM_LOADER_NUM_THREADS", "1", 1);
  LoadedModel m = model_load(fixture_dir(GetParam()), ModelOptions{});
  unsetenv("ATOM_DISABLE_MMAP");
  unsetenv("ATOM_LOADER_NUM_THREADS");
  Tensor logits = score_tokens(*m.model, ref.input_ids);
  EXPECT_LE(max_abs_diff(logits, ref.logits), kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity, ::testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace atom::test
