// The spec's expert loading on the MoE fixtures: the expert mapping (per-expert, Mixtral and
// stacked names), ExpertStagingPool's rules (one copy when complete, per-region otherwise, decline,
// padding, redundant slots, coverage), one thread against many, shared-expert fusion, and clear
// errors for bad checkpoints and configs.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <regex>

#include "common/fixtures.h"
#include "common/layer_context.h"
#include "common/tensor_util.h"
#include "common/test_util.h"
#include "core/convert.h"
#include "engine/sequence_runner.h"
#include "layers/moe.h"
#include "loader/expert_staging.h"
#include "loader/safetensors.h"
#include "models/loading.h"

namespace atom::test {
namespace {

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old) old_ = old;
    had_ = old != nullptr;
    setenv(name, value, 1);
  }
  ~ScopedEnv() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

using TensorList = std::vector<std::pair<std::string, Tensor>>;

TensorList read_all(const std::string& dir) {
  TensorList ts;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    SafetensorsFile f(e.path().string(), false);
    for (const auto& t : f.header().entries) ts.emplace_back(t.name, f.tensor(t).clone());
  }
  return ts;
}

// A copy of fixture `name` in `dir` (one file, no index) with its tensors passed through `edit`.
void write_edited(const std::string& name, const std::string& dir,
                  const std::function<void(TensorList&)>& edit) {
  for (const auto& e : std::filesystem::directory_iterator(fixture_dir(name)))
    if (e.path().extension() == ".json" && e.path().filename() != "model.safetensors.index.json")
      std::filesystem::copy_file(e.path(), std::filesystem::path(dir) / e.path().filename());
  TensorList ts = read_all(fixture_dir(name));
  edit(ts);
  safetensors_write(dir + "/model.safetensors", ts);
}

// Per-expert names -> stacked experts.gate_up_proj [E, 2I, H] / experts.down_proj [E, H, I], for
// the layers whose index satisfies `which`.
void stack_experts(TensorList& ts, const std::function<bool(int64_t)>& which) {
  static const std::regex re(R"((.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight)");
  std::map<std::string, std::map<std::pair<int, std::string>, Tensor>> groups;
  TensorList rest;
  for (auto& [n, t] : ts) {
    std::smatch m;
    if (std::regex_match(n, m, re) && which(weight_name_layer_index(n)))
      groups[m[1]][{std::stoi(m[2]), m[3]}] = t;
    else
      rest.emplace_back(n, t);
  }
  for (auto& [prefix, g] : groups) {
    const int E = static_cast<int>(g.size() / 3);
    const Tensor& g0 = g.at({0, "gate_proj"});
    const Tensor& d0 = g.at({0, "down_proj"});
    const int64_t I = g0.size(0), H = g0.size(1);
    Tensor gu = Tensor::empty({E, 2 * I, H}, g0.dtype()), dn = Tensor::empty({E, H, I}, d0.dtype());
    for (int e = 0; e < E; ++e) {
      Tensor a = gu.select(0, e).narrow(0, 0, I), b = gu.select(0, e).narrow(0, I, I);
      a.copy_from(g.at({e, "gate_proj"}));
      b.copy_from(g.at({e, "up_proj"}));
      Tensor d = dn.select(0, e);
      d.copy_from(g.at({e, "down_proj"}));
    }
    rest.emplace_back(prefix + ".gate_up_proj", gu);
    rest.emplace_back(prefix + ".down_proj", dn);
  }
  ts = rest;
}

void expect_same_weights(Model& a, Model& b) {
  ASSERT_EQ(a.params().all().size(), b.params().all().size());
  for (const auto& [name, p] : a.params().all()) {
    Parameter* q = b.params().find(name);
    ASSERT_TRUE(q) << name;
    ASSERT_EQ(p->data().shape(), q->data().shape()) << name;
    EXPECT_EQ(std::memcmp(p->data().data(), q->data().data(), p->data().nbytes()), 0) << name;
  }
}

LoadedModel load_with_threads(const std::string& dir, const char* threads, ModelOptions o = {}) {
  ScopedEnv env("ATOM_LOADER_NUM_THREADS", threads);
  return model_load(dir, o);
}

TEST(MoeLoading, StagedExpertsGoInOneCopyAndMatchThePerExpertLoader) {
  // qwen3_moe: layers 0 and 2 sparse, 8 experts, two shards.
  LoadedModel staged = load_with_threads(fixture_dir("qwen3_moe"), "4");
  EXPECT_EQ(staged.report.expert_bulk_copies, 4);  // w13 and w2 of two layers
  EXPECT_EQ(staged.report.expert_region_copies, 0);
  LoadedModel direct = load_with_threads(fixture_dir("qwen3_moe"), "1");
  EXPECT_EQ(direct.report.expert_bulk_copies, 0);
  expect_same_weights(*staged.model, *direct.model);
}

TEST(MoeLoading, StackedCheckpointsLoadTheSameWeights) {
  TempDir d;
  // Layer 0 stacked, layer 2 per expert: the stacked path declines the pool for its parameters
  // only.
  write_edited("qwen3_moe", d.str(),
               [](TensorList& ts) { stack_experts(ts, [](int64_t layer) { return layer == 0; }); });
  for (const char* threads : {"4", "1"}) {
    LoadedModel m = load_with_threads(d.str(), threads);
    LoadedModel want = load_with_threads(fixture_dir("qwen3_moe"), "1");
    expect_same_weights(*m.model, *want.model);
    if (std::string(threads) == "4") {
      EXPECT_EQ(m.report.expert_bulk_copies, 2);  // layer 2
    }
  }
  // A stacked tensor and a per-expert tensor for the same expert: a duplicate.
  TempDir dup;
  write_edited("qwen3_moe", dup.str(), [](TensorList& ts) {
    Tensor extra;
    for (auto& [n, t] : ts)
      if (n == "model.layers.0.mlp.experts.3.up_proj.weight") extra = t;
    stack_experts(ts, [](int64_t layer) { return layer == 0; });
    ts.emplace_back("model.layers.0.mlp.experts.3.up_proj.weight", extra);
  });
  EXPECT_ERROR_CONTAINS(load_with_threads(dup.str(), "1"), "model.layers.0.mlp.experts.w13_weight",
                        "twice");
}

TEST(MoeLoading, MissingExpertNamesTheParameterAndTheRegionsThatArrived) {
  TempDir d;
  write_edited("qwen3_moe", d.str(), [](TensorList& ts) {
    std::erase_if(ts,
                  [](auto& p) { return p.first == "model.layers.2.mlp.experts.5.up_proj.weight"; });
  });
  // Staged: the pool's rule.
  EXPECT_ERROR_CONTAINS(load_with_threads(d.str(), "4"), "model.layers.2.mlp.experts.w13_weight",
                        "15 of 16 (slot, shard) regions");
  // One thread: coverage names the part.
  EXPECT_ERROR_CONTAINS(load_with_threads(d.str(), "1"), "model.layers.2.mlp.experts.w13_weight",
                        "part expert 5/w3");
  // Not strict: it loads, the staged regions are copied one by one, the missing one stays zero.
  ScopedEnv lax("ATOM_LOADER_STRICT_COVERAGE", "false");
  LoadedModel m = load_with_threads(d.str(), "4");
  EXPECT_EQ(m.report.expert_region_copies, 15);
  EXPECT_EQ(m.report.expert_bulk_copies, 3);
  Parameter* w13 = m.model->params().find("model.layers.2.mlp.experts.w13_weight");
  ASSERT_TRUE(w13);
  const int64_t I = w13->data().size(1) / 2;
  const Tensor up5 = tensor_cast_cpu(w13->data().select(0, 5).narrow(0, I, I), DType::kF32);
  for (int64_t i = 0; i < up5.numel(); ++i) ASSERT_EQ(up5.ptr<float>()[i], 0.0f);
  const Tensor gate5 = tensor_cast_cpu(w13->data().select(0, 5).narrow(0, 0, I), DType::kF32);
  float any = 0;
  for (int64_t i = 0; i < gate5.numel(); ++i) any += std::abs(gate5.ptr<float>()[i]);
  EXPECT_GT(any, 0.0f);
}

TEST(MoeLoading, MixtralNamesAndBadExpertTensorsAreClearErrors) {
  LoadedModel m = model_load(fixture_dir("mixtral"), {});
  EXPECT_GT(m.report.tensors_loaded, 0);
  TempDir shape;
  write_edited("mixtral", shape.str(), [](TensorList& ts) {
    for (auto& [n, t] : ts)
      if (n == "model.layers.1.block_sparse_moe.experts.2.w2.weight")
        t = Tensor::zeros({64, 40}, t.dtype());
  });
  for (const char* threads : {"4", "1"})
    EXPECT_ERROR_CONTAINS(load_with_threads(shape.str(), threads),
                          "model.layers.1.block_sparse_moe.experts.2.w2.weight",
                          "model.layers.1.mlp.experts.w2_weight", "[64, 40]", "[64, 48]");
  TempDir extra;
  write_edited("mixtral", extra.str(), [](TensorList& ts) {
    ts.emplace_back("model.layers.0.block_sparse_moe.experts.8.w1.weight",
                    Tensor::zeros({48, 64}, DType::kBF16));
  });
  EXPECT_ERROR_CONTAINS(model_load(extra.str(), {}),
                        "model.layers.0.block_sparse_moe.experts.8.w1.weight",
                        "match no parameter");
}

TEST(MoeLoading, SharedExpertFusionGivesIdenticalLogits) {
  // glm4_moe: one shared expert; glm4_moe_air: two, cut into two slots.
  for (const std::string name : {"glm4_moe", "glm4_moe_air"}) {
    SCOPED_TRACE(name);
    const Reference ref = reference_load(name);
    ModelOptions separate, fused;
    separate.fuse_shared_experts = false;
    fused.fuse_shared_experts = true;
    LoadedModel a = model_load(fixture_dir(name), separate);
    LoadedModel b = model_load(fixture_dir(name), fused);
    EXPECT_TRUE(a.model->params().find("model.layers.1.mlp.shared_experts.gate_up_proj.weight"));
    EXPECT_FALSE(b.model->params().find("model.layers.1.mlp.shared_experts.gate_up_proj.weight"));
    const Tensor la = score_tokens(*a.model, ref.input_ids);
    const Tensor lb = score_tokens(*b.model, ref.input_ids);
    ASSERT_EQ(la.shape(), lb.shape());
    if (name == "glm4_moe") {
      // One shared expert is one slot computed by the same products: bit for bit.
      EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.nbytes()), 0) << "fused and separate differ";
    } else {
      // Two shared experts are two slots of half the width: the down projection's sum is split
      // in two, so only fp32 rounding may differ.
      EXPECT_LE(max_abs_diff(la, lb), 1e-5f);
      EXPECT_GT(max_abs_diff(la, lb), 0.0f) << "expected the split sum to round differently";
    }
    EXPECT_LE(max_abs_diff(lb, ref.logits), 1e-4f);
  }
}

TEST(MoeLoading, Mxfp4TensorsThatDoNotFitAreNamed) {
  // A blocks tensor without its scales: refused before any data is read.
  TempDir missing;
  write_edited("gpt_oss_mxfp4", missing.str(), [](TensorList& ts) {
    std::erase_if(ts,
                  [](auto& p) { return p.first == "model.layers.1.mlp.experts.down_proj_scales"; });
  });
  EXPECT_ERROR_CONTAINS(model_load(missing.str(), {}),
                        "model.layers.1.mlp.experts.down_proj_blocks", "has no",
                        "down_proj_scales");
  // Scales of the wrong shape for their blocks.
  TempDir shape;
  write_edited("gpt_oss_mxfp4", shape.str(), [](TensorList& ts) {
    for (auto& [n, t] : ts)
      if (n == "model.layers.0.mlp.experts.gate_up_proj_scales")
        t = Tensor::zeros({t.size(0), t.size(1), t.size(2) + 1}, t.dtype());
  });
  EXPECT_ERROR_CONTAINS(model_load(shape.str(), {}), "MXFP4 blocks", "do not match");
}

// Kimi-K3's release formats, edited: an MXFP4 expert projection without its scales, scales that
// do not fit their values, and an A_log whose padding past the heads is not zero.
TEST(MoeLoading, KimiK3PackedExpertsAndPaddedALogThatDoNotFitAreNamed) {
  const std::string w1 = "language_model.model.layers.1.block_sparse_moe.experts.3.w1.";
  TempDir missing;
  write_edited("kimi_k3_mxfp4", missing.str(), [&](TensorList& ts) {
    std::erase_if(ts, [&](auto& p) { return p.first == w1 + "weight_scale"; });
  });
  EXPECT_ERROR_CONTAINS(model_load(missing.str(), {}), "received no data",
                        "model.layers.1.mlp.experts.w13_weight (part expert 3/w1)");
  TempDir shape;
  write_edited("kimi_k3_mxfp4", shape.str(), [&](TensorList& ts) {
    for (auto& [n, t] : ts)
      if (n == w1 + "weight_scale") t = Tensor::zeros({t.size(0), t.size(1) + 1}, t.dtype());
  });
  EXPECT_ERROR_CONTAINS(model_load(shape.str(), {}), "MXFP4 expert 3", "do not pair");
  TempDir a_log;
  write_edited("kimi_k3", a_log.str(), [](TensorList& ts) {
    for (auto& [n, t] : ts)
      if (n == "language_model.model.layers.0.self_attn.A_log") {
        t = t.clone();
        t.ptr<float>()[t.numel() - 1] = 0.5f;
      }
  });
  EXPECT_ERROR_CONTAINS(model_load(a_log.str(), {}), "self_attn.A_log", "past the heads is 0.5",
                        "not 0 (padding)");
}

TEST(MoeLoading, BadMoeConfigFieldsAreNamed) {
  struct Bad {
    std::string fixture, field, value, message;
  };
  const std::vector<Bad> cases = {
      {"qwen3_moe", "num_experts_per_tok", "9", "num_experts_per_tok"},
      {"qwen3_moe", "decoder_sparse_step", "0", "decoder_sparse_step"},
      {"qwen3_moe", "moe_intermediate_size", "null", "moe_intermediate_size"},
      {"glm4_moe", "n_group", "3", "n_group"},
      {"glm4_moe", "topk_group", "5", "topk_group"},
      {"mixtral", "num_local_experts", "0", "num_local_experts"},
      {"gpt_oss", "num_experts_per_tok", "9", "num_experts_per_tok"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.field);
    TempDir d;
    copy_dir(fixture_dir(c.fixture), d.str());
    std::string cfg = read_file(d.file("config.json"));
    const std::regex field("\"" + c.field + "\": [^,\n]+");
    cfg = std::regex_replace(cfg, field, "\"" + c.field + "\": " + c.value);
    write_file(d.file("config.json"), cfg);
    EXPECT_ERROR_CONTAINS(model_load(d.str(), {}, LoadFormat::kDummy), "config.json", c.message);
  }
}

// The pool's rules on a synthetic two-expert parameter with one shared and one redundant slot.
struct SyntheticExperts {
  ParamRegistry reg;
  Parameter* p;
  SyntheticExperts() {
    Tensor data = Tensor::empty({4, 2, 3}, DType::kF32);  // [slots, rows, cols]
    for (int64_t i = 0; i < data.numel(); ++i) data.ptr<float>()[i] = 7;
    p = &reg.add("experts.w", data,
                 [](Parameter& q, const Tensor& t, const std::string& s, int e) {
                   Tensor r = q.expert_layout->region(q.data().select(0, e), s);
                   q.expert_layout->write(r, t, s);
                 },
                 {"expert 0/a", "expert 1/a"});
    auto layout = std::make_shared<ExpertLayout>();
    layout->num_base = 2;
    layout->num_slots = 4;
    layout->redundant_slots = {3};
    layout->shards = {"a"};
    layout->region = [](const Tensor& slot, const std::string&) { return slot; };
    // Checkpoint rows are [1, 3]: the region's second row is padding.
    layout->write = [](Tensor& region, const Tensor& ckpt, const std::string&) {
      Tensor d = region.narrow(0, 0, 1);
      tensor_assign(d, ckpt);
    };
    p->expert_layout = layout;
  }
  float at(int64_t slot, int64_t row, int64_t col) const {
    return p->data().ptr<float>()[(slot * 2 + row) * 3 + col];
  }
};

TEST(ExpertStagingPool, OneCopyZeroPaddingAndRedundantSlotsAndSharedLeftAlone) {
  SyntheticExperts s;
  ExpertStagingPool pool;
  ASSERT_TRUE(pool.owns(*s.p, 0, "a"));
  EXPECT_FALSE(pool.owns(*s.p, 0, "ct_mxfp4_gate_packed"));  // a model's own format: its loader
  EXPECT_FALSE(pool.owns(*s.p, 2, "a"));  // the shared slot goes straight to the parameter
  pool.stage(*s.p, random_cpu({1, 3}, DType::kF32, 1), "a", 0);
  EXPECT_EQ(s.at(0, 0, 0), 7);  // nothing written until every routed base region arrived
  pool.stage(*s.p, random_cpu({1, 3}, DType::kF32, 2), "a", 1);
  EXPECT_EQ(pool.stats().bulk_copies, 1);
  EXPECT_EQ(s.at(0, 0, 0), random_cpu({1, 3}, DType::kF32, 1).ptr<float>()[0]);
  EXPECT_EQ(s.at(1, 1, 2), 0);  // padding row: zero from the staging buffer
  EXPECT_EQ(s.at(2, 0, 0), 7);  // the shared slot is not the pool's
  EXPECT_EQ(s.at(3, 1, 1), 0);  // the redundant slot is zeroed until filled
  EXPECT_ERROR_CONTAINS(pool.stage(*s.p, random_cpu({1, 3}, DType::kF32, 2), "a", 1), "twice");
  pool.finish();
}

TEST(ExpertStagingPool, DeclineWritesBackWhatWasStagedAndHandsOver) {
  SyntheticExperts s;
  ExpertStagingPool pool;
  pool.stage(*s.p, random_cpu({1, 3}, DType::kF32, 1), "a", 0);
  pool.decline(*s.p);
  EXPECT_EQ(pool.stats().region_copies, 1);
  EXPECT_EQ(pool.stats().declined, 1);
  EXPECT_EQ(s.at(0, 0, 1), random_cpu({1, 3}, DType::kF32, 1).ptr<float>()[1]);
  EXPECT_EQ(s.at(0, 1, 1), 0);  // region granularity: its padding row came along, zero
  EXPECT_EQ(s.at(1, 0, 0), 7);  // not staged, not touched
  EXPECT_FALSE(pool.owns(*s.p, 1, "a"));
  s.p->load(random_cpu({1, 3}, DType::kF32, 2), "a", 1);
  pool.finish();  // complete through the other path: no coverage error
}

TEST(ExpertStagingPool, IncompleteParameterIsAnErrorUnlessNotStrict) {
  for (const bool strict : {true, false}) {
    SyntheticExperts s;
    ExpertStagingPool pool(strict);
    pool.stage(*s.p, random_cpu({1, 3}, DType::kF32, 1), "a", 1);
    if (strict) {
      EXPECT_ERROR_CONTAINS(pool.finish(), "'experts.w'", "1 of 2 (slot, shard) regions");
    } else {
      pool.finish();
      EXPECT_EQ(pool.stats().region_copies, 1);
      EXPECT_EQ(s.at(0, 0, 0), 7);  // left as initialised
    }
  }
}

// FusedMoE with the intermediate padded to 16: the staged and the per-expert paths leave the
// padding zero, and the layer computes what the unpadded one does.
TEST(FusedMoELayer, PaddedIntermediateLoadsZeroTailsOnBothPaths) {
  TempDir d;
  const int64_t E = 3, H = 8, I = 12;
  TensorList ts;
  for (int64_t e = 0; e < E; ++e) {
    const std::string at = "mlp.experts." + std::to_string(e) + ".";
    ts.emplace_back(at + "gate_proj.weight", random_cpu({I, H}, DType::kBF16, 10 + e));
    ts.emplace_back(at + "up_proj.weight", random_cpu({I, H}, DType::kBF16, 20 + e));
    ts.emplace_back(at + "down_proj.weight", random_cpu({H, I}, DType::kBF16, 30 + e));
  }
  safetensors_write(d.file("model.safetensors"), ts);
  WeightLoadSpec spec;
  spec.num_hidden_layers = 1;
  spec.expert_mapping = fused_moe_expert_mapping("gate_proj", "down_proj", "up_proj", E);
  std::vector<Tensor> outs;
  for (const int64_t pad : {1, 16, 16}) {
    ParamRegistry reg;
    TestLayerContext rig(reg);
    LayerContext& ctx = rig.ctx;
    FusedMoEOptions o;
    o.num_experts = E;
    o.hidden = H;
    o.intermediate = I;
    o.pad_intermediate_to = pad;
    FusedMoE moe(ctx, "mlp.experts", o);
    CheckpointReadOptions ro;
    ro.num_threads = outs.size() == 2 ? 1 : 4;  // the second padded load: per-expert loader
    load_weights(reg, Checkpoint(d.str()), spec, ro);
    EXPECT_EQ(moe.intermediate_padded(), pad == 1 ? I : 16);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t r = I; r < moe.intermediate_padded(); ++r)
        for (int64_t c = 0; c < H; ++c) {
          ASSERT_EQ(moe.w13().data().ptr<float>()[(e * 2 * 16 + r) * H + c], 0.0f);
          ASSERT_EQ(moe.w2().data().ptr<float>()[(e * H + c) * 16 + r], 0.0f);
        }
    Batch batch;
    Arena arena(Device::cpu());
    Step step{batch, arena};
    Tensor x = random_cpu({4, H}, DType::kF32, 5);
    Tensor ids = i32({0, 2, 1, 0, 2, 1, 1, 1}).view({4, 2});
    Tensor w = random_cpu({4, 2}, DType::kF32, 6, 0, 1);
    Tensor out = Tensor::empty({4, H}, DType::kF32);
    moe.forward(step, x, ids, w, out);
    outs.push_back(out.clone());
  }
  EXPECT_LE(max_abs_diff(outs[1], outs[0]), 1e-5f);
  EXPECT_EQ(std::memcmp(outs[1].data(), outs[2].data(), outs[1].nbytes()), 0);
}

}  // namespace
}  // namespace atom::test
