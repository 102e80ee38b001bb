// The MTP drafters loaded from their targets' checkpoints (DeepSeekMTP: deepseek_v3_mtp;
// Qwen3NextMTP: qwen3_next_mtp; Qwen3_5MTP: qwen3_5_mtp, qwen3_5_moe_mtp; three shards each, two
// of them without an MTP tensor) against the drafter's forward written in PyTorch from its
// definition by tools/make_fixtures.py (build_mtp, build_qwen_mtp): the prompt rows of draft step
// 0 with the target's own hidden states, then three chained steps on the drafter's normed output.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "loader/weight_names.h"
#include "models/deepseek_mtp.h"
#include "models/draft_model.h"
#include "models/qwen3_next_mtp.h"

namespace atom::test {
namespace {

constexpr int kBlock = 16;
// Measured max |Δlogit| 3.9e-5 at step 0 and 4.8e-5 by step 3 (the drafter's logits have std 3.1,
// and its input carries the target's own rounding); 1e-4 is about twice the largest. The
// normalised L2 error of step 0 is held tighter.
constexpr float kMtpLogitTolerance = 1e-4f;
constexpr double kMtpRelTolerance = 3e-6;  // measured 1.4e-6

// Rows at positions [start, start + tokens.size()) of one sequence whose cache holds pages 0...
Batch seq_batch(const std::vector<int32_t>& tokens, int start, std::vector<int32_t> logits_rows) {
  Batch b;
  b.block_size = kBlock;
  b.token_ids = tokens;
  const int n = static_cast<int>(tokens.size()), end = start + n;
  for (int i = 0; i < n; ++i) {
    b.positions.push_back(start + i);
    b.slot_mapping.push_back(start + i);
  }
  b.query_start = {0, n};
  b.context_lens = {end};
  b.page_indptr = {0, (end + kBlock - 1) / kBlock};
  for (int p = 0; p < b.page_indptr[1]; ++p) b.page_indices.push_back(p);
  b.logits_indices = std::move(logits_rows);
  b.state_slots = {0};
  b.max_query_len = n;
  b.max_context_len = end;
  return b;
}

std::vector<int32_t> all_rows(int n) {
  std::vector<int32_t> r;
  for (int i = 0; i < n; ++i) r.push_back(i);
  return r;
}

int32_t argmax_row(const Tensor& logits, int64_t row) {
  const int64_t V = logits.size(1);
  const float* p = logits.ptr<float>() + row * V;
  return static_cast<int32_t>(std::max_element(p, p + V) - p);
}

TEST(MtpDrafter, RewriteSpecLayerName) {
  // DeepSeek-V3 hub names of the MTP layer 61 (num_hidden_layers 61).
  EXPECT_EQ(deepseek_mtp_rewrite("model.layers.61.enorm.weight", 61, 61),
            "model.layers.61.enorm.weight");
  EXPECT_EQ(deepseek_mtp_rewrite("model.layers.61.shared_head.head.weight", 61, 61),
            "model.layers.61.shared_head.head.weight");
  EXPECT_EQ(deepseek_mtp_rewrite("model.layers.61.embed_tokens.weight", 61, 61),
            "model.embed_tokens.weight");
  EXPECT_EQ(deepseek_mtp_rewrite("model.layers.61.self_attn.kv_a_proj_with_mqa.weight", 61, 61),
            "model.layers.61.mtp_block.self_attn.kv_a_proj_with_mqa.weight");
  EXPECT_EQ(deepseek_mtp_rewrite("model.layers.61.mlp.experts.7.up_proj.weight", 61, 61),
            "model.layers.61.mtp_block.mlp.experts.7.up_proj.weight");
  EXPECT_EQ(deepseek_mtp_rewrite("model.layers.60.mlp.gate.weight", 60, 61), std::nullopt);
  EXPECT_EQ(deepseek_mtp_rewrite("model.embed_tokens.weight", -1, 61), std::nullopt);
  // Through the checkpoint rewriter: a drafter load asks the drafter about every name.
  CheckpointNameRewriter spec(
      61, {}, true, [](const std::string& n, int64_t l) { return deepseek_mtp_rewrite(n, l, 61); });
  EXPECT_EQ(spec.rewrite("model.layers.61.eh_proj.weight"), "model.layers.61.eh_proj.weight");
  EXPECT_EQ(spec.rewrite("model.layers.3.self_attn.o_proj.weight"), std::nullopt);
  EXPECT_EQ(spec.rewrite("lm_head.weight"), std::nullopt);
  CheckpointNameRewriter plain(61, {});
  EXPECT_EQ(plain.rewrite("model.layers.61.eh_proj.weight"), std::nullopt);
  EXPECT_EQ(plain.rewrite("model.layers.3.self_attn.o_proj.weight"),
            "model.layers.3.self_attn.o_proj.weight");
}

TEST(MtpDrafter, LoadsFromTargetCheckpointSkippingShards) {
  const std::string dir = fixture_dir("deepseek_v3_mtp");
  LoadedModel target = model_load(dir, ModelOptions{});
  LoadedDrafter d = drafter_load(dir, *target.model, ModelOptions{});
  // Shards without an MTP tensor, counted from the index independently of the loader.
  const auto index = nlohmann::json::parse(read_file(dir + "/model.safetensors.index.json"));
  std::set<std::string> shards, with_mtp;
  int mtp_tensors = 0;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    shards.insert(shard.get<std::string>());
    if (name.starts_with("model.layers.3.")) {
      with_mtp.insert(shard.get<std::string>());
      ++mtp_tensors;
    }
  }
  // The target's plain load skips exactly those; the drafter loads exactly those.
  EXPECT_EQ(target.report.tensors_not_wanted, mtp_tensors);
  EXPECT_EQ(d.report.tensors_loaded, mtp_tensors);
  ASSERT_EQ(shards.size(), 3u);
  EXPECT_EQ(d.report.checkpoint.shards_total, 3);
  EXPECT_EQ(d.report.checkpoint.shards_skipped, static_cast<int>(shards.size() - with_mtp.size()));
  EXPECT_EQ(d.report.checkpoint.shards_read, static_cast<int>(with_mtp.size()));
  EXPECT_EQ(d.model->num_draft_layers(), 1);
  // The checkpoint has shared_head.head but no MTP embed_tokens: only the embedding is shared,
  // and it is the target's tensor itself.
  ASSERT_EQ(d.shared, std::vector<std::string>{"model.embed_tokens.weight"});
  EXPECT_EQ(d.model->params().find("model.embed_tokens.weight")->data().data(),
            target.model->params().find("model.embed_tokens.weight")->data().data());
}

TEST(MtpDrafter, RefusesCheckpointWithoutMtpLayers) {
  // The config names an MTP layer (transformers' default num_nextn_predict_layers 1) that the
  // checkpoint does not carry.
  LoadedModel target = model_load(fixture_dir("deepseek_v3_plain"), ModelOptions{});
  EXPECT_ERROR_CONTAINS(drafter_load(fixture_dir("deepseek_v3_plain"), *target.model, {}),
                        "no MTP layer to draft with");
  // A config without MTP layers.
  TempDir tmp;
  copy_dir(fixture_dir("deepseek_v3_mtp"), tmp.str());
  auto cfg = nlohmann::json::parse(read_file(tmp.file("config.json")));
  cfg["num_nextn_predict_layers"] = 0;
  write_file(tmp.file("config.json"), cfg.dump());
  LoadedModel zero = model_load(tmp.str(), ModelOptions{});
  EXPECT_ERROR_CONTAINS(drafter_load(tmp.str(), *zero.model, {}), "num_nextn_predict_layers");
  LoadedModel llama = model_load(fixture_dir("llama3_gqa"), ModelOptions{});
  EXPECT_ERROR_CONTAINS(drafter_load(fixture_dir("llama3_gqa"), *llama.model, {}),
                        "no drafter for architecture 'LlamaForCausalLM'");
}

// The drafter of fixture `name` against its PyTorch forward (tools/make_fixtures.py): draft step 0
// over the prompt's rows with the target's own hidden states, then the chained steps on the
// drafter's normed output. Returns the largest |Δlogit| of step 0 and of the chained steps.
std::pair<float, float> check_drafter_forward(const std::string& name, float tolerance,
                                              double rel_tolerance) {
  const std::string dir = fixture_dir(name);
  SafetensorsFile ref(source_dir() + "/tests/fixtures/references/" + name + ".safetensors", true);
  const std::vector<int32_t> ids = ids_of(ref.tensor("input_ids"));
  const int32_t target_next = ids_of(ref.tensor("target_next"))[0];
  const std::vector<int32_t> drafts = ids_of(ref.tensor("draft_tokens"));
  const Tensor prefill_want = ref.tensor("draft_prefill_logits").clone();
  const Tensor steps_want = ref.tensor("draft_step_logits").clone();
  const int T = static_cast<int>(ids.size());

  LoadedModel target = model_load(dir, ModelOptions{});
  LoadedDrafter d = drafter_load(dir, *target.model, ModelOptions{});
  const int pages = 8;
  // The hybrid targets' recurrent layers: one state slot.
  KvCache tkv = KvCache::allocate(target.model->cache_specs(), pages, kBlock, Device::cpu(),
                                  target.model->state_specs(), 1);
  KvCache dkv = KvCache::allocate(d.model->cache_specs(), pages, kBlock, Device::cpu());
  Arena tarena(Device::cpu(), 8 << 20), darena(Device::cpu(), 8 << 20);

  // The target over the prompt: every row's hidden state (after the final norm).
  Batch tb = seq_batch(ids, 0, {T - 1});
  tb.upload(tarena);
  Step ts{tb, tarena, &tkv};
  Tensor hidden = target.model->forward(ts);
  Tensor tlogits = target.model->compute_logits(ts, hidden);
  EXPECT_EQ(argmax_row(tlogits, 0), target_next) << name << ": the target itself disagrees";

  // Step 0: row i is (token i + 1, target hidden i) at position i.
  std::vector<int32_t> next(ids.begin() + 1, ids.end());
  next.push_back(target_next);
  Batch b0 = seq_batch(next, 0, all_rows(T));
  b0.upload(darena);
  Step s0{b0, darena, &dkv};
  Tensor y = d.model->forward_draft(s0, hidden, 0);
  Tensor logits = d.model->compute_draft_logits(s0, y, 0);
  const float e0 = expect_logits_near(logits, prefill_want, tolerance, name + " draft step 0");
  EXPECT_LE(rel_err(logits, prefill_want, name + " draft step 0"), rel_tolerance);
  std::printf("%s draft step 0: normalised L2 error %.3g\n", name.c_str(),
              rel_err(logits, prefill_want));
  EXPECT_EQ(argmax_row(logits, T - 1), drafts[0]);
  // Steps >= 1: one row each, the last draft with the drafter's own normed output (copied out of
  // the arena the next step reuses).
  Tensor carry = y.narrow(0, T - 1, 1).clone();
  float e_steps = 0;
  for (int k = 1; k < static_cast<int>(drafts.size()); ++k) {
    Batch bk = seq_batch({drafts[static_cast<size_t>(k - 1)]}, T - 1 + k, {0});
    darena.reset();
    bk.upload(darena);
    Step sk{bk, darena, &dkv};
    Tensor yk = d.model->forward_draft(sk, carry, k);
    Tensor lk = d.model->compute_draft_logits(sk, yk, k);
    e_steps = std::max(e_steps, expect_logits_near(lk, steps_want.narrow(0, k - 1, 1), tolerance,
                                                   name + " draft step " + std::to_string(k)));
    EXPECT_EQ(argmax_row(lk, 0), drafts[static_cast<size_t>(k)]) << "draft step " << k;
    carry = yk.clone();
  }
  std::printf("%s: max |Δlogit| step 0 %.3g, steps 1-%zu %.3g\n", name.c_str(), e0,
              drafts.size() - 1, e_steps);
  return {e0, e_steps};
}

TEST(MtpDrafter, ForwardMatchesPyTorchReference) {
  check_drafter_forward("deepseek_v3_mtp", kMtpLogitTolerance, kMtpRelTolerance);
}

// Qwen3NextMTP and Qwen3_5MTP (dense and MoE) against the predictor written in PyTorch from its
// definition around transformers' own decoder layer.
// Measured max |Δlogit| at step 0 / steps 1-3 (drafter logits std 3.2-4.1): qwen3_next_mtp
// 9.3e-5 / 2.3e-4, qwen3_5_mtp 1.5e-4 / 1.0e-4, qwen3_5_moe_mtp 1.8e-4 / 3.0e-4 (the hybrid
// targets' hidden states carry the gated delta rule's rounding, chunked in transformers and
// atom alike); normalised L2 error of step 0 at most 5.2e-6. Bounds about 1.7x and 2x those.
constexpr float kQwenMtpLogitTolerance = 5e-4f;
constexpr double kQwenMtpRelTolerance = 1e-5;

class QwenMtpForward : public ::testing::TestWithParam<std::string> {};

TEST_P(QwenMtpForward, MatchesPyTorchReference) {
  check_drafter_forward(GetParam(), kQwenMtpLogitTolerance, kQwenMtpRelTolerance);
}

INSTANTIATE_TEST_SUITE_P(Drafters, QwenMtpForward,
                         ::testing::Values("qwen3_next_mtp", "qwen3_5_mtp", "qwen3_5_moe_mtp"),
                         [](const auto& info) { return info.param; });

TEST(MtpDrafter, QwenRewriteSpecLayerName) {
  // Qwen3-Next / Qwen3.5 hub names: mtp.* -> model.*, the target's tensors not wanted.
  EXPECT_EQ(qwen3_next_mtp_rewrite("mtp.fc.weight"), "model.fc.weight");
  EXPECT_EQ(qwen3_next_mtp_rewrite("mtp.pre_fc_norm_embedding.weight"),
            "model.pre_fc_norm_embedding.weight");
  EXPECT_EQ(qwen3_next_mtp_rewrite("mtp.layers.0.mlp.experts.5.down_proj.weight"),
            "model.layers.0.mlp.experts.5.down_proj.weight");
  EXPECT_EQ(qwen3_next_mtp_rewrite("mtp.norm.weight"), "model.norm.weight");
  EXPECT_EQ(qwen3_next_mtp_rewrite("model.layers.0.self_attn.q_proj.weight"), std::nullopt);
  EXPECT_EQ(qwen3_next_mtp_rewrite("model.norm.weight"), std::nullopt);
  EXPECT_EQ(qwen3_next_mtp_rewrite("lm_head.weight"), std::nullopt);
}

// Loaded from the target's checkpoint: exactly the mtp.* tensors, the shards holding none of them
// skipped from their headers (counted here from the index), embed_tokens and lm_head (tied or
// not) the target's own tensors.
TEST(MtpDrafter, QwenLoadsFromTargetCheckpointSkippingShards) {
  for (const std::string name : {"qwen3_next_mtp", "qwen3_5_mtp", "qwen3_5_moe_mtp"}) {
    SCOPED_TRACE(name);
    const std::string dir = fixture_dir(name);
    LoadedModel target = model_load(dir, ModelOptions{});
    LoadedDrafter d = drafter_load(dir, *target.model, ModelOptions{});
    const auto index = nlohmann::json::parse(read_file(dir + "/model.safetensors.index.json"));
    std::set<std::string> shards, with_mtp;
    int mtp_tensors = 0;
    for (const auto& [n, shard] : index["weight_map"].items()) {
      shards.insert(shard.get<std::string>());
      if (n.starts_with("mtp.")) {
        with_mtp.insert(shard.get<std::string>());
        ++mtp_tensors;
      }
    }
    ASSERT_EQ(shards.size(), 3u);
    ASSERT_LT(with_mtp.size(), shards.size());
    EXPECT_GE(target.report.tensors_not_wanted, mtp_tensors);
    EXPECT_EQ(d.report.tensors_loaded, mtp_tensors);
    EXPECT_EQ(d.report.checkpoint.shards_skipped,
              static_cast<int>(shards.size() - with_mtp.size()));
    EXPECT_EQ(d.report.checkpoint.shards_read, static_cast<int>(with_mtp.size()));
    EXPECT_EQ(d.model->num_draft_layers(), 1);
    const bool tied = target.model->config().tie_word_embeddings;
    std::vector<std::string> want = {"model.embed_tokens.weight"};
    if (!tied) want.push_back("lm_head.weight");
    EXPECT_EQ(d.shared, want);
    for (const auto& p : want)
      EXPECT_EQ(d.model->params().find(p)->data().data(),
                target.model->params().find(p)->data().data())
          << p;
  }
}

TEST(MtpDrafter, QwenRefusesCheckpointWithoutMtpLayers) {
  // qwen3_5 carries no mtp.* tensor; qwen3_next a partial set (fc, norm, one layer norm): the
  // parameters that got nothing are named.
  LoadedModel plain = model_load(fixture_dir("qwen3_5"), ModelOptions{});
  EXPECT_ERROR_CONTAINS(drafter_load(fixture_dir("qwen3_5"), *plain.model, {}),
                        "no MTP layer to draft with");
  LoadedModel partial = model_load(fixture_dir("qwen3_next"), ModelOptions{});
  EXPECT_ERROR_CONTAINS(drafter_load(fixture_dir("qwen3_next"), *partial.model, {}),
                        "received no data from the checkpoint");
  TempDir tmp;
  copy_dir(fixture_dir("qwen3_5_mtp"), tmp.str());
  auto cfg = nlohmann::json::parse(read_file(tmp.file("config.json")));
  cfg["text_config"]["mtp_num_hidden_layers"] = 0;
  write_file(tmp.file("config.json"), cfg.dump());
  LoadedModel zero = model_load(tmp.str(), ModelOptions{});
  EXPECT_ERROR_CONTAINS(drafter_load(tmp.str(), *zero.model, {}), "mtp_num_hidden_layers");
}

}  // namespace
}  // namespace atom::test
