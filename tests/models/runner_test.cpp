// ModelRunner on the CPU: default KV sizing, and tokens computed on the model's device (greedy and
// seeded sampling) against the host logits; execute_sampling's split of rows between the device
// sampler and the host.
#include <gtest/gtest.h>

#include <algorithm>

#include "common/fixtures.h"
#include "engine/model_runner.h"
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

// kernels::sample of one row of host logits.
int32_t draw(const Tensor& logits, int64_t row, const kernels::SamplingRow& p) {
  Tensor one = logits.narrow(0, row, 1).contiguous();
  Tensor id = Tensor::empty({1}, DType::kI32);
  kernels::sample(id, one, kernels::sampling_rows_tensor({p}));
  return id.ptr<int32_t>()[0];
}

TEST(Runner, ExecuteSamplingDrawsSomeRowsAndReturnsTheOthers) {
  LoadedModel m = model_load(fixture_dir("llama3_gqa"), ModelOptions{});
  RunnerOptions o;
  o.max_model_len = 64;
  o.max_num_seqs = 4;
  ModelRunner r(*m.model, o);
  const std::vector<int32_t> tokens = {5, 17, 300, 42, 8, 99, 1, 64};
  auto batch = [&] {
    Batch b = prompt_batch(tokens, r.block_size());
    b.logits_indices = {7, 6, 5, 4, 3};
    return b;
  };
  Batch b0 = batch();
  const Tensor logits = r.execute(b0).clone();  // [5, V], the reference rows
  const int64_t V = logits.size(1);
  std::vector<kernels::SamplingRow> params(5);
  for (int i = 0; i < 5; ++i) {
    params[i].temperature = i == 2 ? 0.0f : 0.6f + 0.2f * static_cast<float>(i);
    params[i].top_k = i == 3 ? 10 : 0;
    params[i].top_p = i == 4 ? 0.8f : 1.0f;
    params[i].seed = 100 + static_cast<uint64_t>(i);
    params[i].step = static_cast<uint64_t>(i);
  }
  struct Case {
    std::vector<int32_t> device, host;
  };
  // Few device rows (gathered), most rows (all drawn), none; host rows in any order, or all.
  for (const Case& c : {Case{{3, 0}, {4, 1}}, Case{{4, 0, 2}, {}}, Case{{}, {0, 1, 2, 3, 4}},
                        Case{{1, 2, 3, 4, 0}, {2}}}) {
    StepSampling want;
    for (int32_t row : c.device) {
      want.device_rows.push_back(row);
      want.device_params.push_back(params[row]);
    }
    want.host_rows = c.host;
    Batch b = batch();
    StepSamples got;
    r.execute_sampling(b, want, got);
    ASSERT_EQ(got.tokens.size(), c.device.size());
    for (size_t i = 0; i < c.device.size(); ++i)
      EXPECT_EQ(got.tokens[i], draw(logits, c.device[i], params[c.device[i]]))
          << "row " << c.device[i];
    if (c.host.empty()) continue;
    ASSERT_TRUE(got.host_logits.device().is_cpu());
    ASSERT_EQ(got.host_logits.size(0), static_cast<int64_t>(c.host.size()));
    for (size_t i = 0; i < c.host.size(); ++i)
      for (int64_t v = 0; v < V; ++v)
        ASSERT_EQ(got.host_logits.ptr<float>()[i * V + v], logits.ptr<float>()[c.host[i] * V + v])
            << "host row " << i;
  }
}

}  // namespace
}  // namespace atom::test
