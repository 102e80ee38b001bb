// Pipeline parallelism on CPU ranks: the layers split into stages (vLLM's partition), each stage
// holding only its layers (the first the embedding, the last the final norm and head), handing
// the hidden state and the residual stream to the next through a StageLink. Logits equal the
// single rank's (bit for bit without tensor parallelism: the stages run the same ops on the same
// values) and transformers'; each stage reads only its share of the checkpoint.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "engine/sequence_runner.h"
#include "models/loading.h"
#include "models/model_group.h"

namespace atom::test {
namespace {

struct PpCase {
  std::string fixture;
  int pp;
  int tp = 1;
  bool ep = false;
};

void PrintTo(const PpCase& c, std::ostream* os) {
  *os << c.fixture << " pp " << c.pp << " tp " << c.tp << (c.ep ? " ep" : "");
}

std::unique_ptr<ModelGroup> pp_group(const PpCase& c) {
  ModelOptions o;
  o.pp_size = c.pp;
  o.expert_parallel = c.ep;
  return model_group_load(fixture_dir(c.fixture), o, c.tp);
}

class PipelineParallel : public ::testing::TestWithParam<PpCase> {};

TEST_P(PipelineParallel, StagesReproduceSingleRankLogits) {
  const PpCase c = GetParam();
  const Reference ref = reference_load(c.fixture);
  LoadedModel solo = model_load(fixture_dir(c.fixture), {});
  const Tensor want = score_tokens(*solo.model, ref.input_ids);
  auto group = pp_group(c);
  ASSERT_EQ(group->pp_size(), c.pp);
  ASSERT_EQ(group->world_size(), c.pp * c.tp);
  // Whole prompt, then in chunks across pages: each stage's cache holds its layers' context.
  const Tensor whole = score_tokens(*group, ref.input_ids);
  const Tensor chunked = score_tokens(*group, ref.input_ids, /*chunk=*/5, /*block_size=*/4);
  const Tensor solo_chunked =
      score_tokens(*solo.model, ref.input_ids, /*chunk=*/5, /*block_size=*/4);
  // Without tensor parallelism the stages compute exactly what one rank computes.
  const float tol = c.tp == 1 ? 0.0f : tp_logit_tolerance(c.fixture);
  expect_logits_near(whole, want, tol, "whole prompt");
  expect_logits_near(chunked, solo_chunked, tol, "chunks of 5 over pages of 4");
  expect_cpu_parity(whole, ref.logits, c.fixture, "stages vs transformers");
  const GreedyResult g = generate_greedy(*group, ref.greedy_prompt,
                                         static_cast<int>(ref.greedy_tokens.size()), {}, true);
  EXPECT_EQ(g.token_ids, ref.greedy_tokens);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, PipelineParallel,
    ::testing::Values(PpCase{"llama3_gqa", 2}, PpCase{"llama3_gqa", 3},  // one layer a stage
                      PpCase{"qwen3_tied", 2},  // the tied head on the last stage
                      PpCase{"qwen3_moe", 2, 2}, PpCase{"mixtral", 2, 2, true},  // pp x tp, ep
                      PpCase{"deepseek_v2_lite", 2},                             // MLA
                      PpCase{"qwen3_next", 2}, PpCase{"qwen3_next", 2, 2},       // hybrid, GDN
                      PpCase{"kimi_linear", 3},                                  // KDA + MLA
                      // GLM-5: stage 1 begins with a shared layer, handed stage 0's selection
                      PpCase{"glm_moe_dsa", 3},
                      // hyper-connection streams handed on; GLM-5.3's stage 1 opens with a
                      // shared layer; V4's compressor states per stage
                      PpCase{"deepseek_v4", 2}, PpCase{"deepseek_v4", 2, 2}, PpCase{"glm5_next", 2},
                      PpCase{"glm5_next", 2, 2},
                      // Kimi-K3's attention-residual bank handed on: with 2 stages the second
                      // (layers 3-5) opens mid-block, with 3 each stage opens a block
                      PpCase{"kimi_k3", 2}, PpCase{"kimi_k3", 3, 2}),
    [](const auto& info) {
      const PpCase& c = info.param;
      return c.fixture + "_pp" + std::to_string(c.pp) + "_tp" + std::to_string(c.tp) +
             (c.ep ? "_ep" : "");
    });

// vLLM's partition: num_layers / pp each, the remainder one more each on the stages before the
// last (which also holds the head).
TEST(PipelineStage, VllmPartition) {
  auto layers = [](int64_t n, int size) {
    std::vector<std::pair<int64_t, int64_t>> r;
    for (int s = 0; s < size; ++s) {
      const PipelineStage st = pipeline_stage(n, s, size);
      r.emplace_back(st.first_layer, st.end_layer);
    }
    return r;
  };
  using V = std::vector<std::pair<int64_t, int64_t>>;
  // vLLM's own cases (tests/distributed/test_pipeline_partition.py).
  EXPECT_EQ(layers(2, 2), (V{{0, 1}, {1, 2}}));
  EXPECT_EQ(layers(3, 2), (V{{0, 2}, {2, 3}}));
  EXPECT_EQ(layers(3, 3), (V{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_EQ(layers(4, 3), (V{{0, 1}, {1, 3}, {3, 4}}));
  EXPECT_EQ(layers(5, 3), (V{{0, 2}, {2, 4}, {4, 5}}));
  EXPECT_EQ(layers(7, 3), (V{{0, 2}, {2, 5}, {5, 7}}));                  // [2, 3, 2]
  EXPECT_EQ(layers(61, 4), (V{{0, 15}, {15, 30}, {30, 46}, {46, 61}}));  // [15, 15, 16, 15]
  EXPECT_EQ(layers(3, 1), (V{{0, 3}}));
  // VLLM_PP_LAYER_PARTITION's layer counts (vLLM's goldens "5,5,5,5", "4,6,6,4", "4,4,4,8").
  auto custom = [](int64_t n, const std::vector<int>& parts) {
    std::vector<std::pair<int64_t, int64_t>> r;
    for (int s = 0; s < static_cast<int>(parts.size()); ++s) {
      const PipelineStage st = pipeline_stage(n, s, static_cast<int>(parts.size()), parts);
      r.emplace_back(st.first_layer, st.end_layer);
    }
    return r;
  };
  EXPECT_EQ(custom(20, {5, 5, 5, 5}), (V{{0, 5}, {5, 10}, {10, 15}, {15, 20}}));
  EXPECT_EQ(custom(20, {4, 6, 6, 4}), (V{{0, 4}, {4, 10}, {10, 16}, {16, 20}}));
  EXPECT_EQ(custom(20, {4, 4, 4, 8}), (V{{0, 4}, {4, 8}, {8, 12}, {12, 20}}));
  EXPECT_ERROR_CONTAINS(pipeline_stage(20, 0, 4, {5, 5, 5}), "must be 4 positive layer counts",
                        "got 3 counts adding up to 15");
  EXPECT_ERROR_CONTAINS(pipeline_stage(20, 0, 2, {21, -1}), "must be 2 positive layer counts");
  EXPECT_ERROR_CONTAINS(pipeline_stage(3, 0, 4), "more than the model's 3 layers");
  EXPECT_ERROR_CONTAINS(pipeline_stage(3, 2, 2), "pipeline-parallel rank 2 of size 2 is invalid");
}

// Each stage reads only its modules: the stages' bytes add up to one load of the checkpoint, and
// each stage leaves the others' tensors unread (counted).
TEST(PipelineParallelLoad, EachStageReadsOnlyItsShare) {
  const std::string dir = fixture_dir("qwen3_moe");
  LoadedModel solo = model_load(dir, {});
  const uint64_t full = solo.report.checkpoint.bytes_read;
  ASSERT_GT(full, 0u);
  uint64_t sum = 0;
  size_t params = 0;
  for (int s = 0; s < 2; ++s) {
    ModelOptions o;
    o.pp_rank = s;
    o.pp_size = 2;
    LoadedModel m = model_load(dir, o);
    const LoadReport& r = m.report;
    EXPECT_GT(r.tensors_other_stages, 0) << "stage " << s;
    EXPECT_EQ(r.checkpoint.bytes_read + r.bytes_other_stages, full) << "stage " << s;
    EXPECT_LT(r.checkpoint.bytes_read, full * 3 / 4) << "stage " << s;
    sum += r.checkpoint.bytes_read;
    params += m.model->params().all().size();
    // The first stage holds the embedding and no head; the last the norm and head.
    EXPECT_EQ(m.model->params().find("model.embed_tokens.weight") != nullptr, s == 0);
    EXPECT_EQ(m.model->params().find("lm_head.weight") != nullptr, s == 1);
    EXPECT_EQ(m.model->params().find("model.layers.0.self_attn.qkv_proj.weight") != nullptr,
              s == 0);
    EXPECT_EQ(m.model->params().find("model.layers.2.self_attn.qkv_proj.weight") != nullptr,
              s == 1);
  }
  EXPECT_EQ(sum, full);
  EXPECT_EQ(params, solo.model->params().all().size());
}

// DeepSeek-V4.1's fixture (compress_ratios 0 2 1 1 1: layer 1 FULL with Engram; layer 2 FULL and
// the candidate source; 3 REINDEX and 4 REUSE on layer 2's compressed rows) in 2 stages of layers
// 0-1 and 2-4 (VLLM_PP_LAYER_PARTITION 2,3), which keeps every layer with its sources: the streams
// and the last site's pre handed on. Alone the stages compute exactly what one rank computes; with
// 2 tensor-parallel ranks a stage within 1e-5 of the largest logit; greedy tokens the reference's.
TEST(PipelineParallelDeepseekV41, StagesKeepingTheirSourcesReproduceSingleRankLogits) {
  const std::string name = "deepseek_v41";
  const Reference ref = reference_load(name);
  LoadedModel solo = model_load(fixture_dir(name), {});
  const Tensor want = score_tokens(*solo.model, ref.input_ids);
  const Tensor solo_chunked =
      score_tokens(*solo.model, ref.input_ids, /*chunk=*/5, /*block_size=*/4);
  for (const int tp : {1, 2}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    ModelOptions o;
    o.pp_size = 2;
    o.pp_layer_partition = {2, 3};
    auto group = model_group_load(fixture_dir(name), o, tp);
    ASSERT_EQ(group->pp_size(), 2);
    const Tensor whole = score_tokens(*group, ref.input_ids);
    const Tensor chunked = score_tokens(*group, ref.input_ids, /*chunk=*/5, /*block_size=*/4);
    const double rel_whole = max_rel_diff(whole, want),
                 rel_chunked = max_rel_diff(chunked, solo_chunked);
    std::printf("deepseek_v41 pp 2 (layers 0-1, 2-4) tp %d: max |Δlogit| / max |logit| vs one "
                "rank %.3g whole, %.3g in chunks of 5 over pages of 4\n",
                tp, rel_whole, rel_chunked);
    EXPECT_LE(rel_whole, tp == 1 ? 0.0 : 1e-5);
    EXPECT_LE(rel_chunked, tp == 1 ? 0.0 : 1e-5);
    const GreedyResult g = generate_greedy(*group, ref.greedy_prompt,
                                           static_cast<int>(ref.greedy_tokens.size()), {}, true);
    EXPECT_EQ(g.token_ids, ref.greedy_tokens);
  }
}

// A partition putting a layer's source on an earlier stage is refused at load, naming the layer,
// the field and both stages: vLLM's default split of the fixture's 5 layers (0-2, 3-4) leaves
// layers 3 and 4 without layer 2's compressed rows; with kv_source_layer_ids [1] (every compressed
// layer on layer 1's rows, ratio 1) even layers 0-1, 2-4 are refused.
TEST(PipelineParallelDeepseekV41, SourceOnAnEarlierStageIsRefused) {
  ModelOptions o;
  o.pp_size = 2;
  EXPECT_ERROR_CONTAINS(model_group_load(fixture_dir("deepseek_v41"), o, 1),
                        "layer 3 reads the compressed KV rows of layer 2",
                        "(config.json (text_config) kv_source_layer_ids)",
                        "pipeline stage 0 (layers 0-2)", "layer 3's stage 1 (layers 3-4)");
  TempDir d;
  copy_dir(fixture_dir("deepseek_v41"), d.str());
  const std::string path = d.str() + "/config.json";
  nlohmann::json c = json_load_file(path);
  c["text_config"]["compress_ratios"] = {0, 1, 1, 1, 1, 0};
  c["text_config"]["kv_source_layer_ids"] = {1};
  write_file(path, c.dump());
  o.pp_layer_partition = {2, 3};
  EXPECT_ERROR_CONTAINS(model_group_load(d.str(), o, 1),
                        "layer 2 reads the compressed KV rows of layer 1", "kv_source_layer_ids",
                        "pipeline stage 0 (layers 0-1)", "layer 2's stage 1 (layers 2-4)");
  // One stage builds the edited topology (dummy weights: the fixture's are for the other one).
  EXPECT_NO_THROW(model_load(d.str(), {}, LoadFormat::kDummy));
}

// The released V4.1-Flash layout (40 + 1 layers: 0-1 window, 2-19 ratio 2, 20-39 ratio 1; KV
// sources 2, 8, 14, 20; index sources also 25, 30, 35, 38; candidates from layer 20) on the
// fixture's sizes, built with dummy weights stage by stage: vLLM's split in 2 (0-19, 20-39) keeps
// every layer with its sources; in 4 (10 each) layer 10 would read layer 8's rows and is refused;
// 4 stages starting at KV sources (8, 6, 6, 20 layers) run, the ratio-1 run of 20 layers whole.
TEST(PipelineParallelDeepseekV41, ReleasedLayoutSplitsOnlyAtKvSources) {
  TempDir d;
  copy_dir(fixture_dir("deepseek_v41"), d.str());
  const std::string path = d.str() + "/config.json";
  nlohmann::json c = json_load_file(path);
  nlohmann::json& t = c["text_config"];
  std::vector<int> ratios;
  for (int i = 0; i < 41; ++i) ratios.push_back(i < 2 || i == 40 ? 0 : i < 20 ? 2 : 1);
  t["num_hidden_layers"] = 40;
  t["compress_ratios"] = ratios;
  t["kv_source_layer_ids"] = {2, 8, 14, 20};
  t["index_source_layer_ids"] = {2, 8, 14, 20, 25, 30, 35, 38};
  t["candidate_source_layer_id"] = 20;
  write_file(path, c.dump());
  auto stages = [&](int size, const std::vector<int>& partition) {
    for (int r = 0; r < size; ++r) {
      ModelOptions o;
      o.pp_rank = r;
      o.pp_size = size;
      o.pp_layer_partition = partition;
      model_load(d.str(), o, LoadFormat::kDummy);
    }
  };
  EXPECT_NO_THROW(stages(2, {}));
  EXPECT_ERROR_CONTAINS(stages(4, {}), "layer 10 reads the compressed KV rows of layer 8",
                        "kv_source_layer_ids", "pipeline stage 0 (layers 0-9)",
                        "layer 10's stage 1 (layers 10-19)");
  EXPECT_NO_THROW(stages(4, {8, 6, 6, 20}));
  EXPECT_ERROR_CONTAINS(stages(3, {20, 10, 10}),
                        "layer 30 reads the compressed KV rows of layer 20");
}

TEST(PipelineParallelErrors, ClearMessages) {
  ModelOptions o;
  o.pp_size = 4;
  EXPECT_ERROR_CONTAINS(model_group_load(fixture_dir("llama3_gqa"), o, 1),
                        "--pipeline-parallel-size 4 is more than the model's 3 layers");
  o.pp_size = 0;
  EXPECT_ERROR_CONTAINS(model_group_load(fixture_dir("llama3_gqa"), o, 1),
                        "--pipeline-parallel-size must be at least 1");
  o.pp_size = 2;
  o.device = Device::cuda(0);
  // A stage per GPU: more stages than visible GPUs is refused naming both (the test machines have
  // fewer than 64).
  o.pp_size = 64;
  EXPECT_ERROR_CONTAINS(model_group_load(fixture_dir("llama3_gqa"), o, 1),
                        "--tensor-parallel-size 1 x --pipeline-parallel-size 64 needs 64 GPUs");
  o.pp_size = 2;
  o.tp_size = 2;
  o.ranks_share_device = true;
  EXPECT_ERROR_CONTAINS(model_group_load(fixture_dir("llama3_gqa"), o, 2),
                        "a tensor-parallel group of 2 ranks cannot share cuda");
}

}  // namespace
}  // namespace atom::test
