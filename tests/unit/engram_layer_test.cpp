// The Engram module (src/layers/engram.h) against tools/engram_layer_reference.py: its hash rows,
// embeddings and gated output on one sequence, written by torch from the public definition.
#include "layers/engram.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/fixtures.h"
#include "dist/communicator.h"
#include "loader/safetensors.h"

namespace atom {
namespace {

// The reference's config (tools/engram_layer_reference.py).
EngramConfig reference_config() {
  EngramConfig c;
  c.layer_ids = {3};
  c.num_embeddings = {240};
  c.max_ngram_size = 3;
  c.vocab_sizes = {50, 50};
  c.n_heads = 2;
  c.head_dim = 8;
  c.pad_token_id = 0;
  c.compressed_vocab_size = 40;
  c.seed = 7;
  c.where = "engram_layer_test";
  return c;
}

struct Rig {
  ParamRegistry params;
  std::vector<CacheSpec> caches;
  std::vector<StateCacheSpec> states;
  SoloCommunicator solo;
  LayerContext ctx = cpu_ctx(params);
  LayerContext cpu_ctx(ParamRegistry& p) {
    return {p,       Device::cpu(), DType::kF32, DType::kF32, 0,  1,    &solo,
            &caches, &states,       false,       nullptr,     {}, false};
  }
  EngramHash hash{reference_config()};
  SafetensorsFile ref{test::source_dir() + "/tests/fixtures/references/engram_layer.safetensors",
                      /*use_mmap=*/true};
  Engram engram{ctx, "engram", hash, 3, 16, 4};
  Rig() {
    for (const char* n :
         {"engram.embed.weight", "engram.wkv.weight", "engram.k_weight", "engram.q_weight"})
      params.find(n)->data().copy_from(ref.tensor(n).clone());
  }
  std::vector<int64_t> ids() const {
    const Tensor t = ref.tensor("ids").clone();
    return {t.ptr<int64_t>(), t.ptr<int64_t>() + t.numel()};
  }
};

float max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  float m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float d = std::abs(a.ptr<float>()[i] - b.ptr<float>()[i]);
    if (!(d <= m)) m = std::isnan(d) ? INFINITY : d;
  }
  return m;
}

TEST(Engram, OutputMatchesTheTorchReference) {
  Rig r;
  const std::vector<int64_t> ids = r.ids();
  const int64_t T = static_cast<int64_t>(ids.size());
  // The rows the layer reads are the reference's.
  const std::vector<int64_t> rows = r.hash.rows(ids, 3, 0);
  const Tensor want_rows = r.ref.tensor("rows").clone();
  ASSERT_EQ(static_cast<int64_t>(rows.size()), want_rows.numel());
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i], want_rows.ptr<int64_t>()[i]) << i;
  Tensor emb = Tensor::empty({T, r.engram.width()}, DType::kF32);
  r.engram.embed(ids, 0, 0, {emb.ptr<float>(), static_cast<size_t>(emb.numel())});
  Batch batch;
  Arena arena(Device::cpu());
  Step step{batch, arena};
  // The layer adds its read into the streams: the read is what it added.
  const Tensor before = r.ref.tensor("streams").clone();
  Tensor streams = before.clone();
  r.engram.add(step, streams, emb);
  Tensor out = Tensor::empty(streams.shape(), DType::kF32);
  for (int64_t i = 0; i < out.numel(); ++i)
    out.ptr<float>()[i] = streams.ptr<float>()[i] - before.ptr<float>()[i];
  const float d = max_diff(out, r.ref.tensor("out").clone());
  std::printf("engram vs torch: max |Δ| %.3g\n", d);
  EXPECT_LE(d, 1e-5f);
}

// Positions embedded after a history (a later chunk or a decode step) read the same rows as in
// the whole sequence: the n-grams reach back into the history.
TEST(Engram, EmbeddingsAfterAHistoryEqualTheWholeSequences) {
  Rig r;
  const std::vector<int64_t> ids = r.ids();
  const int64_t T = static_cast<int64_t>(ids.size()), W = r.engram.width();
  std::vector<float> whole(static_cast<size_t>(T * W)), tail(static_cast<size_t>((T - 5) * W));
  r.engram.embed(ids, 0, 0, whole);
  r.engram.embed(ids, 0, 5, tail);
  for (int64_t i = 0; i < (T - 5) * W; ++i)
    ASSERT_EQ(tail[static_cast<size_t>(i)], whole[static_cast<size_t>(5 * W + i)]) << i;
  // Without the history the first positions' n-grams see padding: different rows.
  std::vector<float> alone(static_cast<size_t>((T - 5) * W));
  r.engram.embed(std::span<const int64_t>(ids).subspan(5), 0, 0, alone);
  EXPECT_NE(alone, tail);
}

TEST(Engram, BadInputsAreNamed) {
  Rig r;
  Batch batch;
  Arena arena(Device::cpu());
  Step step{batch, arena};
  Tensor three_streams = Tensor::zeros({2, 3, 16}, DType::kF32),
         four_streams = Tensor::zeros({2, 4, 16}, DType::kF32);
  EXPECT_THROW(r.engram.add(step, three_streams, Tensor::zeros({2, r.engram.width()}, DType::kF32)),
               Error);
  EXPECT_THROW(r.engram.add(step, four_streams, Tensor::zeros({3, r.engram.width()}, DType::kF32)),
               Error);
  ParamRegistry p2;
  LayerContext c2 = r.cpu_ctx(p2);
  EXPECT_THROW(Engram(c2, "other", r.hash, 4, 16, 4), Error);  // layer 4 has no engram
}

}  // namespace
}  // namespace atom
