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
//
// DSparkFp8.*: the stages in DeepSeek's native FP8 / FP4 format (tools/make_dspark_fp8_fixture.py)
// load as the target's layers do, dequantised at load: the target and drafter from the quantised
// folder against those from its numpy-dequantised twin, max |Δ| / max |want| 0 for the target
// logits and for every block's base and biased logits, confidences equal, drafts identical
// (bounds 1e-5, 1e-6); the quantisation itself moves the base logits from the unquantised
// fixture's by 1.1 to 1.7 relative. Planted once: the stages' FP8 scales skipped (2^0) gives 0.95
// to 1.3 (base logits), confidences off by up to 0.91, every block's drafts different; the
// stages' scale check by name off leaves 4 of the 5 bad-stage errors without the tensor's name.
// The engine with DSpark on the quantised folder: tests/engine/spec_decode_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>

#include "common/fixtures.h"
#include "common/tensor_util.h"
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
constexpr double kDSparkRel = 1e-3;  // the issue's bound; measured values are printed

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

// What a target and its drafter give for a batch of prompts (host copies): the target over the
// prompts in one batch (pages of 4, sequence s in pages [16 s, 16 s + 16)) handing over the
// drafter's layers, the drafter absorbing every row, then a block of `width` drafts after each
// prompt's greedy token (the anchor).
struct DraftRun {
  Tensor target_logits;  // [S, vocab]: each prompt's last row
  std::vector<int32_t> anchors;
  BlockDraftModel::Block block;  // base_logits and logits cloned out of the step's arena
};

DraftRun run_draft(Model& target, BlockDraftModel& drafter,
                   const std::vector<std::vector<int32_t>>& prompts, int width) {
  const int S = static_cast<int>(prompts.size());
  std::vector<int> zero(prompts.size(), 0), lens;
  for (const auto& p : prompts) lens.push_back(static_cast<int>(p.size()));
  const int pages = S * kPagesPerSeq;
  KvCache tkv = KvCache::allocate(target.cache_specs(), pages, kBlock, Device::cpu(),
                                  target.state_specs(), S);
  KvCache dkv = KvCache::allocate(drafter.cache_specs(), pages, kBlock, Device::cpu());
  Arena tarena(Device::cpu(), 32 << 20), darena(Device::cpu(), 32 << 20);

  Batch tb = seqs_batch(prompts, zero, true, lens);
  for (int s = 0; s < S; ++s) tb.logits_indices.push_back(tb.query_start[s + 1] - 1);
  tb.upload(tarena);
  Step ts{tb, tarena, &tkv};
  const std::vector<int64_t> layers = drafter.target_layer_outputs();
  Tensor outputs;
  ts.layer_outputs = &layers;
  ts.layer_outputs_out = &outputs;
  Tensor hidden = target.forward(ts);
  DraftRun r;
  r.target_logits = target.compute_logits(ts, hidden).clone();
  EXPECT_TRUE(outputs.defined());
  EXPECT_EQ(outputs.size(0), tb.num_tokens());
  EXPECT_EQ(outputs.size(1), static_cast<int64_t>(layers.size()) * target.config().hidden_size);

  Step as{tb, darena, &dkv};
  drafter.absorb(as, outputs);
  const int64_t V = r.target_logits.size(1);
  std::vector<std::vector<int32_t>> anchors;
  for (int s = 0; s < S; ++s) {
    const float* row = r.target_logits.ptr<float>() + s * V;
    r.anchors.push_back(static_cast<int32_t>(std::max_element(row, row + V) - row));
    anchors.push_back({r.anchors.back()});
  }
  Batch db = seqs_batch(anchors, lens, false, lens);  // x0 at p + 1 = len, context p + 1
  db.upload(darena);
  Step ds{db, darena, &dkv};
  r.block = drafter.draft_block(ds, width);
  r.block.base_logits = r.block.base_logits.clone();
  r.block.logits = r.block.logits.clone();
  return r;
}

// The reference's prompts case0..case{n-1}.
std::vector<std::vector<int32_t>> reference_prompts(const SafetensorsFile& ref, int n) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i)
    prompts.push_back(ids_of(ref.tensor("case" + std::to_string(i) + "_prompt")));
  return prompts;
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
  const std::vector<std::vector<int32_t>> prompts = reference_prompts(ref, S);
  // The target over the three prompts in one batch, handing over layers 1, 3 and 4; the drafter
  // absorbs every row, then drafts a block after each prompt's greedy token.
  const DraftRun r = run_draft(*target.model, *drafter, prompts, W);
  const BlockDraftModel::Block& block = r.block;
  for (int s = 0; s < S; ++s)
    EXPECT_EQ(r.anchors[static_cast<size_t>(s)],
              ids_of(ref.tensor("case" + std::to_string(s) + "_anchor"))[0])
        << "the target disagrees with the reference's anchor, case " << s;
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
    std::printf("dspark %s (%zu tokens): base logits max rel %.3g, biased %.3g, confidence max "
                "|d| %.3g, drafts %s\n",
                c.c_str(), prompts[static_cast<size_t>(s)].size(), base, biased, dc,
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

using TensorList = std::vector<std::pair<std::string, Tensor>>;

// A copy of checkpoint folder `from` in `to` with its tensors and its text config edited.
void copy_edited(const std::string& from, TempDir& to,
                 const std::function<void(TensorList&)>& tensors,
                 const std::function<void(nlohmann::json&)>& config = {}) {
  copy_dir(from, to.str());
  const std::string file = to.file("model.safetensors");
  TensorList all;
  {
    SafetensorsFile f(file, /*use_mmap=*/false);
    for (const auto& e : f.header().entries) all.emplace_back(e.name, f.tensor(e).contiguous());
  }
  tensors(all);
  std::filesystem::remove(file);
  safetensors_write(file, all);
  if (config) {
    nlohmann::json c = json_load_file(to.str() + "/config.json");
    config(c["text_config"]);
    write_file(to.str() + "/config.json", c.dump());
  }
}

// The released checkpoint's spellings: the Markov tables under markov_head.embed / .head (the
// modules that once held them), and the stages' own mixture (dspark_n_routed_experts,
// dspark_num_experts_per_tok, ROCm/ATOM's draft MoE). A copy of the fixture with the tables
// renamed drafts exactly as the fixture; one whose stages have 12 experts, the 4 new ones with
// random weights but a correction bias of -1e4 so that the router never picks them, drafts
// exactly as the fixture's 8 too (so the field is read and the tensors land where the router
// looks); dspark_num_experts_per_tok 3 instead of the target's 2 changes the drafts' logits (the
// field reaches the router); bad values, and tensors of another count, are errors naming them.
TEST(DSpark, ReleasedNamesAndTheStagesOwnExperts) {
  SafetensorsFile ref(source_dir() + "/tests/fixtures/references/" + kDSpark + ".safetensors",
                      true);
  const std::vector<std::vector<int32_t>> prompts = reference_prompts(ref, 3);
  const int W = 5;
  auto run = [&](const std::string& dir) {
    LoadedModel target = model_load(dir, {});
    LoadedDrafter d = drafter_load(dir, *target.model, {});
    auto* drafter = dynamic_cast<BlockDraftModel*>(d.model.get());
    EXPECT_NE(drafter, nullptr);
    return run_draft(*target.model, *drafter, prompts, W);
  };
  auto edited = [](TempDir& d, const std::function<void(TensorList&)>& tensors,
                   const std::function<void(nlohmann::json&)>& config) {
    copy_edited(fixture_dir(kDSpark), d, tensors, config);
  };
  auto same = [&](const DraftRun& got, const DraftRun& want, const char* what) {
    EXPECT_EQ(got.block.tokens, want.block.tokens) << what;
    EXPECT_EQ(max_rel(got.block.logits, want.block.logits), 0.0) << what;
    EXPECT_EQ(got.block.confidence, want.block.confidence) << what;
  };
  const DraftRun base = run(fixture_dir(kDSpark));

  TempDir renamed;
  edited(
      renamed,
      [](TensorList& all) {
        for (auto& [n, t] : all) {
          n = std::regex_replace(n, std::regex(R"(\.markov_head\.markov_w1\.)"),
                                 ".markov_head.embed.");
          n = std::regex_replace(n, std::regex(R"(\.markov_head\.markov_w2\.)"),
                                 ".markov_head.head.");
        }
      },
      [](nlohmann::json&) {});
  same(run(renamed.str()), base, "markov_head.embed / .head");

  // Stages of 12 experts: the gate's 4 new rows and the new experts random, their correction
  // bias -1e4 (never picked).
  auto twelve = [](TensorList& all) {
    uint64_t seed = 40;
    TensorList extra;
    for (auto& [n, t] : all) {
      if (!n.starts_with("mtp.")) continue;
      if (n.ends_with(".ffn.gate.weight") || n.ends_with(".ffn.gate.bias")) {
        const Tensor old = f32_host(t);
        const bool bias = n.ends_with(".bias");
        Tensor grown = bias ? Tensor::zeros({12}, DType::kF32)
                            : random_cpu({12, old.size(1)}, DType::kF32, seed++, -0.1f, 0.1f);
        std::copy_n(old.ptr<float>(), old.numel(), grown.ptr<float>());
        if (bias)
          for (int e = 8; e < 12; ++e) grown.ptr<float>()[e] = -1e4f;
        t = grown;
      }
      const std::string tag = ".ffn.experts.0.";
      if (const size_t at = n.find(tag); at != std::string::npos)
        for (int e = 8; e < 12; ++e)
          extra.emplace_back(n.substr(0, at) + ".ffn.experts." + std::to_string(e) + "." +
                                 n.substr(at + tag.size()),
                             random_cpu(t.shape(), DType::kF32, seed++, -0.5f, 0.5f));
    }
    all.insert(all.end(), extra.begin(), extra.end());
  };
  TempDir grown;
  edited(grown, twelve, [](nlohmann::json& t) { t["dspark_n_routed_experts"] = 12; });
  same(run(grown.str()), base, "12 experts, 4 never routed");

  TempDir three;
  edited(
      three, [](TensorList&) {}, [](nlohmann::json& t) { t["dspark_num_experts_per_tok"] = 3; });
  const DraftRun top3 = run(three.str());
  const double moved = max_rel(top3.block.base_logits, base.block.base_logits);
  std::printf("dspark: 3 experts per token instead of 2 moves the base logits by %.3g\n", moved);
  EXPECT_GT(moved, 1e-3) << "dspark_num_experts_per_tok is not read";

  auto load = [&](const std::function<void(TensorList&)>& tensors,
                  const std::function<void(nlohmann::json&)>& config) {
    TempDir d;
    edited(d, tensors, config);
    LoadedModel target = model_load(d.str(), {});
    drafter_load(d.str(), *target.model, {});
  };
  const auto none = [](TensorList&) {};
  EXPECT_ERROR_CONTAINS(load(none, [](auto& t) { t["dspark_n_routed_experts"] = 0; }),
                        "'dspark_n_routed_experts'");
  EXPECT_ERROR_CONTAINS(load(none, [](auto& t) { t["dspark_num_experts_per_tok"] = 9; }),
                        "'dspark_num_experts_per_tok'");
  // The config says 12, the stages hold 8.
  EXPECT_ERROR_CONTAINS(load(none, [](auto& t) { t["dspark_n_routed_experts"] = 12; }),
                        "mtp.0.ffn.gate.", "expected [12");
}

// DeepSeek's native FP8 / FP4 format for the stages too (tools/make_dspark_fp8_fixture.py:
// tests/fixtures/models/deepseek_v41_dspark_fp8/quantized, the DSpark fixture with the target's
// and the stages' linears FP8 in 32 x 32 blocks with E8M0 scales, main_proj too, the routed
// experts FP4, the Engram table FP8; dequantized/, the same values decoded by numpy into BF16).
// The target and drafter loaded from each give the same target logits, base and biased block
// logits, confidences and drafts for the three prompts.
std::string dspark_fp8_dir(const std::string& which) {
  return fixture_dir("deepseek_v41_dspark_fp8") + "/" + which;
}

TEST(DSparkFp8, StagesInTheNativeFormatDraftAsTheirDequantisedCheckpoint) {
  SafetensorsFile ref(source_dir() + "/tests/fixtures/references/" + kDSpark + ".safetensors",
                      true);
  const std::vector<std::vector<int32_t>> prompts = reference_prompts(ref, 3);
  const int S = 3, W = 5;
  auto run = [&](const std::string& dir) {
    LoadedModel target = model_load(dir, {});
    LoadedDrafter d = drafter_load(dir, *target.model, {});
    auto* drafter = dynamic_cast<BlockDraftModel*>(d.model.get());
    EXPECT_NE(drafter, nullptr);
    EXPECT_EQ(d.shared.size(), 2u);
    return run_draft(*target.model, *drafter, prompts, W);
  };
  const DraftRun q = run(dspark_fp8_dir("quantized"));
  const DraftRun dq = run(dspark_fp8_dir("dequantized"));
  // The full-precision fixture before quantisation: the format moved the values, so a loader
  // that read the codes without their scales (or not at all) could not pass.
  const DraftRun full = run(fixture_dir(kDSpark));
  const double target_rel = max_rel(q.target_logits, dq.target_logits);
  std::printf("dspark fp8: target logits max rel %.3g (quantized vs dequantized), %.3g (vs the "
              "unquantised fixture)\n",
              target_rel, max_rel(q.target_logits, full.target_logits));
  EXPECT_LE(target_rel, 1e-5);
  EXPECT_EQ(q.anchors, dq.anchors);
  ASSERT_EQ(q.block.tokens.size(), static_cast<size_t>(S * W));
  ASSERT_EQ(dq.block.tokens.size(), q.block.tokens.size());
  double moved = 0;
  for (int s = 0; s < S; ++s) {
    const auto rows = [&](const Tensor& t) { return t.narrow(0, s * W, W); };
    const double base = max_rel(rows(q.block.base_logits), rows(dq.block.base_logits));
    const double biased = max_rel(rows(q.block.logits), rows(dq.block.logits));
    const double from_full = max_rel(rows(q.block.base_logits), rows(full.block.base_logits));
    moved = std::max(moved, from_full);
    double dc = 0;
    for (int k = 0; k < W; ++k) {
      const size_t i = static_cast<size_t>(s * W + k);
      dc = std::max(dc,
                    static_cast<double>(std::abs(q.block.confidence[i] - dq.block.confidence[i])));
    }
    const std::vector<int32_t> got(q.block.tokens.begin() + s * W,
                                   q.block.tokens.begin() + (s + 1) * W);
    const std::vector<int32_t> want(dq.block.tokens.begin() + s * W,
                                    dq.block.tokens.begin() + (s + 1) * W);
    std::printf("dspark fp8 case%d (%zu tokens): base logits max rel %.3g, biased %.3g, "
                "confidence max |d| %.3g (quantized vs dequantized); base logits vs the "
                "unquantised fixture %.3g; drafts %s\n",
                s, prompts[static_cast<size_t>(s)].size(), base, biased, dc, from_full,
                testing::PrintToString(got).c_str());
    EXPECT_LE(base, 1e-5) << "case " << s;
    EXPECT_LE(biased, 1e-5) << "case " << s;
    EXPECT_LE(dc, 1e-6) << "case " << s;
    EXPECT_EQ(got, want) << "case " << s;
  }
  EXPECT_GT(moved, 1e-3) << "the quantisation changed nothing the drafter computes";
}

// A stage's quantised tensors that do not fit together are errors naming the tensor, before any
// data is read (the target, which does not read the stages, loads).
TEST(DSparkFp8, BadQuantizedStagesAreErrorsNamingTheTensor) {
  auto load_edited = [](const std::function<void(TensorList&)>& edit) {
    TempDir d;
    copy_edited(dspark_fp8_dir("quantized"), d, edit);
    LoadedModel target = model_load(d.str(), {});
    drafter_load(d.str(), *target.model, {});
  };
  auto drop = [](const std::string& name) {
    return [name](TensorList& all) {
      std::erase_if(all, [&](const auto& p) { return p.first == name; });
    };
  };
  EXPECT_ERROR_CONTAINS(load_edited(drop("mtp.0.attn.wq_b.scale")), "mtp.0.attn.wq_b.weight",
                        "no scale");
  EXPECT_ERROR_CONTAINS(load_edited(drop("mtp.0.main_proj.scale")), "mtp.0.main_proj.weight",
                        "no scale");
  EXPECT_ERROR_CONTAINS(load_edited(drop("mtp.1.ffn.experts.6.w2.scale")),
                        "mtp.1.ffn.experts.6.w2.weight", "no scale");
  EXPECT_ERROR_CONTAINS(load_edited(drop("mtp.1.ffn.shared_experts.w3.weight")),
                        "mtp.1.ffn.shared_experts.w3.scale", "has no weight");
  // A scale grid of the wrong shape (wkv [32, 64] in 32 x 32 blocks is [1, 2]).
  EXPECT_ERROR_CONTAINS(load_edited([](TensorList& all) {
                          for (auto& [n, v] : all)
                            if (n == "mtp.1.attn.wkv.scale")
                              v = Tensor::zeros({2, 2}, DType::kE8M0);
                        }),
                        "mtp.1.attn.wkv.scale", "[2, 2]", "[1, 2]");
  EXPECT_NO_THROW(load_edited([](TensorList&) {}));
}

}  // namespace
}  // namespace atom::test
