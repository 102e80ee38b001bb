// DSpark, DeepSeek-V4.1's block drafter (models/dspark.h), against tools/dspark_reference.py, a
// PyTorch forward written from ROCm/ATOM's public definition, on its tiny fixture
// (tests/fixtures/models/deepseek_v41_dspark: the deepseek_v41 target with two DSpark stages,
// target layers [1, 3, 4], a block of 5): the target over three prompts (36, 5 and 20 tokens;
// the 5-token one shorter than the window of 8) in one batch hands over its layer outputs, the
// drafter absorbs them and drafts a block after each prompt's greedy token. Measured on this
// machine (2026-12-07, F32 on the CPU): max |Δ| / max |want| of the base logits 5.6e-7, 1.3e-6,
// 7.8e-7, of the biased logits 1.2e-7 to 1.3e-6, confidences within 4.2e-7, every draft the
// reference's. Planted once: the target handing over each layer's input instead of its output
// (one layer early) gives 0.26 to 0.51 (the drafts stay the reference's: the Markov head is
// planted to follow the target, so the logits are what catch it). The engine with DSpark is in
// tests/engine/spec_decode_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "loader/safetensors.h"
#include "models/draft_model.h"
#include "models/dspark.h"
#include "models/loading.h"

namespace atom::test {
namespace {

constexpr const char* kDSpark = "deepseek_v41_dspark";
constexpr int kBlock = 4;            // pages of 4 tokens: the window crosses pages
constexpr int kPagesPerSeq = 16;     // sequence s holds pages [16 s, 16 s + 16)
constexpr double kDSparkRel = 1e-3;  // the bound; measured values are printed

// Sequences of `tokens[s]` rows at positions [start[s], ...), sequence s in its own pages.
Batch seqs_batch(const std::vector<std::vector<int32_t>>& tokens, const std::vector<int>& start,
                 bool write, const std::vector<int>& context) {
  Batch b;
  b.block_size = kBlock;
  b.query_start = {0};
  b.page_indptr = {0};
  for (size_t s = 0; s < tokens.size(); ++s) {
    const int n = static_cast<int>(tokens[s].size()), page0 = static_cast<int>(s) * kPagesPerSeq;
    for (int i = 0; i < n; ++i) {
      const int pos = start[s] + i;
      b.token_ids.push_back(tokens[s][static_cast<size_t>(i)]);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(write ? (page0 + pos / kBlock) * kBlock + pos % kBlock : -1);
    }
    b.query_start.push_back(b.num_tokens());
    b.context_lens.push_back(context[s]);
    for (int p = 0; p < (context[s] + kBlock - 1) / kBlock; ++p)
      b.page_indices.push_back(page0 + p);
    b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
    b.state_slots.push_back(static_cast<int32_t>(s));
    b.max_query_len = std::max(b.max_query_len, n);
    b.max_context_len = std::max(b.max_context_len, context[s]);
  }
  return b;
}

// max |got - want| / max |want| over [rows, V] F32.
double max_rel(const Tensor& got, const Tensor& want) {
  const Tensor g = f32_host(got), w = f32_host(want);
  EXPECT_EQ(g.numel(), w.numel());
  double d = 0, m = 0;
  for (int64_t i = 0; i < std::min(g.numel(), w.numel()); ++i) {
    d = std::max(d, static_cast<double>(std::abs(g.ptr<float>()[i] - w.ptr<float>()[i])));
    m = std::max(m, static_cast<double>(std::abs(w.ptr<float>()[i])));
  }
  return d / m;
}

TEST(DSpark, DraftBlockMatchesTheReference) {
  const std::string dir = fixture_dir(kDSpark);
  SafetensorsFile ref(source_dir() + "/tests/fixtures/references/" + kDSpark + ".safetensors",
                      true);
  LoadedModel target = model_load(dir, {});
  LoadedDrafter d = drafter_load(dir, *target.model, {});
  auto* drafter = dynamic_cast<BlockDraftModel*>(d.model.get());
  ASSERT_NE(drafter, nullptr);
  EXPECT_EQ(drafter->method(), "dspark");
  EXPECT_EQ(drafter->target_layer_outputs(), (std::vector<int64_t>{1, 3, 4}));
  EXPECT_EQ(drafter->num_draft_layers(), 2);
  // The embedding and the head are the target's.
  EXPECT_EQ(d.shared.size(), 2u);
  ASSERT_TRUE(target.model->hands_over_layer_outputs());

  const int S = 3, W = 5;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> zero, lens;
  for (int i = 0; i < S; ++i) {
    prompts.push_back(ids_of(ref.tensor("case" + std::to_string(i) + "_prompt")));
    zero.push_back(0);
    lens.push_back(static_cast<int>(prompts.back().size()));
  }
  const int pages = S * kPagesPerSeq;
  KvCache tkv = KvCache::allocate(target.model->cache_specs(), pages, kBlock, Device::cpu(),
                                  target.model->state_specs(), S);
  KvCache dkv = KvCache::allocate(drafter->cache_specs(), pages, kBlock, Device::cpu());
  Arena tarena(Device::cpu(), 32 << 20), darena(Device::cpu(), 32 << 20);

  // The target over the three prompts in one batch, handing over layers 1, 3 and 4.
  Batch tb = seqs_batch(prompts, zero, true, lens);
  for (int s = 0; s < S; ++s) tb.logits_indices.push_back(tb.query_start[s + 1] - 1);
  tb.upload(tarena);
  Step ts{tb, tarena, &tkv};
  const std::vector<int64_t> layers = drafter->target_layer_outputs();
  Tensor outputs;
  ts.layer_outputs = &layers;
  ts.layer_outputs_out = &outputs;
  Tensor hidden = target.model->forward(ts);
  Tensor tlogits = target.model->compute_logits(ts, hidden);
  ASSERT_TRUE(outputs.defined());
  ASSERT_EQ(outputs.size(0), tb.num_tokens());
  ASSERT_EQ(outputs.size(1), 3 * target.model->config().hidden_size);

  // The drafter absorbs every row, then drafts a block after each prompt's greedy token.
  Step as{tb, darena, &dkv};
  drafter->absorb(as, outputs);
  std::vector<std::vector<int32_t>> anchors;
  for (int s = 0; s < S; ++s) {
    const int64_t V = tlogits.size(1);
    const float* row = tlogits.ptr<float>() + s * V;
    anchors.push_back({static_cast<int32_t>(std::max_element(row, row + V) - row)});
    EXPECT_EQ(anchors.back()[0], ids_of(ref.tensor("case" + std::to_string(s) + "_anchor"))[0])
        << "the target disagrees with the reference's anchor, case " << s;
  }
  std::vector<int> next;
  for (int s = 0; s < S; ++s) next.push_back(lens[static_cast<size_t>(s)] + 0);
  Batch db = seqs_batch(anchors, next, false, lens);  // x0 at p + 1 = len, context p + 1
  db.upload(darena);
  Step ds{db, darena, &dkv};
  BlockDraftModel::Block block = drafter->draft_block(ds, W);
  ASSERT_EQ(block.tokens.size(), static_cast<size_t>(S * W));
  const int64_t V = block.logits.size(1);
  for (int s = 0; s < S; ++s) {
    const std::string c = "case" + std::to_string(s);
    const double base =
        max_rel(block.base_logits.narrow(0, s * W, W), ref.tensor(c + "_base_logits"));
    const double biased = max_rel(block.logits.narrow(0, s * W, W), ref.tensor(c + "_logits"));
    const std::vector<int32_t> want = ids_of(ref.tensor(c + "_tokens"));
    const std::vector<int32_t> got(block.tokens.begin() + s * W,
                                   block.tokens.begin() + (s + 1) * W);
    const Tensor conf = f32_host(ref.tensor(c + "_confidence"));
    double dc = 0;
    for (int k = 0; k < W; ++k)
      dc = std::max(dc,
                    static_cast<double>(std::abs(block.confidence[static_cast<size_t>(s * W + k)] -
                                                 conf.ptr<float>()[k])));
    std::printf("dspark %s (%d tokens): base logits max rel %.3g, biased %.3g, confidence max "
                "|d| %.3g, drafts %s\n",
                c.c_str(), lens[static_cast<size_t>(s)], base, biased, dc,
                testing::PrintToString(got).c_str());
    EXPECT_LE(base, kDSparkRel) << c;
    EXPECT_LE(biased, kDSparkRel) << c;
    EXPECT_LE(dc, 1e-3) << c;
    EXPECT_EQ(got, want) << c;
  }
  EXPECT_EQ(V, target.model->vocab_size());
}

// A checkpoint without DSpark fields is refused by name; a method the drafter does not serve
// too (through the engine: tests/engine/spec_decode_test.cpp).
TEST(DSpark, RefusesACheckpointWithoutDSparkStages) {
  LoadedModel target = model_load(fixture_dir("deepseek_v41"), {});
  EXPECT_ERROR_CONTAINS(drafter_load(fixture_dir("deepseek_v41"), *target.model, {}),
                        "dspark_block_size");
}

// The dspark_* fields are untrusted: each bad value is an error naming its field.
TEST(DSpark, BadFieldsAreErrorsNamingThem) {
  // The drafter reads its fields from the target's config: both load from the edited folder.
  auto load_edited = [](const std::function<void(nlohmann::json&)>& edit) {
    TempDir d;
    copy_dir(fixture_dir("deepseek_v41_dspark"), d.str());
    nlohmann::json c = json_load_file(d.str() + "/config.json");
    edit(c["text_config"]);
    write_file(d.str() + "/config.json", c.dump());
    LoadedModel target = model_load(d.str(), {});
    drafter_load(d.str(), *target.model, {});
  };
  EXPECT_ERROR_CONTAINS(load_edited([](auto& t) { t.erase("dspark_block_size"); }),
                        "'dspark_block_size' is missing");
  EXPECT_ERROR_CONTAINS(load_edited([](auto& t) { t["dspark_block_size"] = 0; }),
                        "'dspark_block_size' must be in");
  EXPECT_ERROR_CONTAINS(load_edited([](auto& t) { t["dspark_noise_token_id"] = 256; }),
                        "'dspark_noise_token_id'");
  EXPECT_ERROR_CONTAINS(load_edited([](auto& t) { t["dspark_markov_rank"] = -1; }),
                        "'dspark_markov_rank'");
  EXPECT_ERROR_CONTAINS(load_edited([](auto& t) {
                          t["dspark_target_layer_ids"] = nlohmann::json::array({1, 5});
                        }),
                        "'dspark_target_layer_ids'", "layer 5");
  EXPECT_ERROR_CONTAINS(
      load_edited([](auto& t) { t["dspark_target_layer_ids"] = nlohmann::json::array(); }),
      "'dspark_target_layer_ids'", "must name target layers");
  EXPECT_ERROR_CONTAINS(load_edited([](auto& t) { t["dspark_num_layers"] = 0; }),
                        "'dspark_num_layers'");
  EXPECT_NO_THROW(load_edited([](auto&) {}));
}

}  // namespace
}  // namespace atom::test
