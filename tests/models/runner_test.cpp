// ModelRunner on the CPU: default KV sizing, and tokens computed on the model's device (greedy and
// seeded sampling) against the host logits.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/model_runner.h"
#include "common/fixtures.h"
#include "models/loading.h"

namespace atom::test {
namespace {

Batch prompt_batch(const std::vector<int32_t>& tokens, int block_size) {
  Batch b;
  b.token_ids = tokens;
  const int n = static_cast<int>(tokens.size());
  for (int i = 0; i < n; ++i) {
    b.positions.push_back(i);
    b.slot_mapping.push_back(i);
  }
  b.query_start = {0, n};
  b.context_lens = {n};
  b.page_indptr = {0, (n + block_size - 1) / block_size};
  for (int p = 0; p < b.page_indptr[1]; ++p) b.page_indices.push_back(p);
  b.logits_indices = {n - 1, n - 2};
  b.state_slots = {0};
  return b;
}

TEST(Runner, CpuDefaultsAndDeviceTokens) {
  LoadedModel m = model_load(fixture_dir("llama3_gqa"), ModelOptions{});
  RunnerOptions o;
  o.max_model_len = 64;
  o.max_num_seqs = 4;
  ModelRunner r(*m.model, o);
  EXPECT_EQ(r.num_pages(), 4 * 64 / 16);
  EXPECT_EQ(r.max_model_len(), 64);
  EXPECT_TRUE(r.graph_buckets().empty());

  const std::vector<int32_t> tokens = {5, 17, 300, 42, 8, 99, 1};
  Batch b1 = prompt_batch(tokens, r.block_size());
  Tensor logits = r.execute(b1);
  ASSERT_EQ(logits.size(0), 2);
  Batch b2 = prompt_batch(tokens, r.block_size());
  const auto ids = r.execute_greedy(b2);
  for (int row = 0; row < 2; ++row) {
    const float* p = logits.ptr<float>() + row * logits.size(1);
    EXPECT_EQ(ids[row], static_cast<int32_t>(std::max_element(p, p + logits.size(1)) - p));
  }
  kernels::SamplingRow hot;
  hot.temperature = 0.8f;
  hot.top_k = 20;
  hot.seed = 7;
  Batch b3 = prompt_batch(tokens, r.block_size());
  const auto sampled = r.execute_sample(b3, {hot, kernels::SamplingRow{}});
  Tensor want = Tensor::empty({2}, DType::kI32);
  kernels::sample(want, logits, kernels::sampling_rows_tensor({hot, kernels::SamplingRow{}}));
  EXPECT_EQ(sampled[0], want.ptr<int32_t>()[0]);
  EXPECT_EQ(sampled[1], ids[1]);
}

}  // namespace
}  // namespace atom::test
