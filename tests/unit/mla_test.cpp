// Multi-head latent attention's CPU kernels against direct double-precision derivations: the
// rotary write of q_pe / k_pe and the latent row, absorbed attention over paged latent rows
// (dense, and over an indexer's selection), the indexer's top-k with ties and short contexts,
// YaRN's softmax-scale correction; and the cache kinds and the batch's one field list.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/tensor_util.h"
#include "common/test_util.h"
#include "kernels/layer_norm.h"
#include "kernels/mla.h"
#include "layers/batch.h"
#include "layers/context.h"
#include "layers/mla.h"

namespace atom::test {
namespace {

float at(const Tensor& t, int64_t i) { return t.ptr<float>()[i]; }

// A batch of sequences with the given (new tokens, context) over pages of `bs` tokens, pages
// numbered in reverse so that logical and physical pages differ.
struct PagedBatch {
  Tensor query_start, context_lens, page_indptr, page_indices;
  std::vector<std::vector<int>> pages;  // physical page of each logical page, per sequence
  int num_pages = 0;
  kernels::AttentionBatch view() {
    return {&query_start, &context_lens, &page_indptr, &page_indices};
  }
};

PagedBatch paged_batch(const std::vector<std::pair<int, int>>& seqs, int bs) {
  PagedBatch b;
  std::vector<int32_t> qs = {0}, cl, pip = {0}, pid;
  int total = 0;
  for (auto [q, n] : seqs) total += (n + bs - 1) / bs;
  b.num_pages = total;
  int next = total - 1;
  for (auto [q, n] : seqs) {
    qs.push_back(qs.back() + q);
    cl.push_back(n);
    std::vector<int> mine;
    for (int p = 0; p < (n + bs - 1) / bs; ++p) {
      mine.push_back(next);
      pid.push_back(next--);
    }
    pip.push_back(static_cast<int32_t>(pid.size()));
    b.pages.push_back(mine);
  }
  b.query_start = i32(qs);
  b.context_lens = i32(cl);
  b.page_indptr = i32(pip);
  b.page_indices = i32(pid);
  return b;
}

TEST(MlaKernels, RopeCacheWriteRotatesTheRopePartsAndWritesTheRow) {
  const int H = 2, N = 3, R = 4, L = 5, T = 3, bs = 4;
  for (const bool interleaved : {false, true}) {
    SCOPED_TRACE(interleaved ? "interleaved" : "halves");
    Tensor q = random_cpu({T, H * (N + R)}, DType::kF32, 1);
    Tensor kv = random_cpu({T, L + R}, DType::kF32, 2);
    const Tensor q0 = q.clone(), kv0 = kv.clone();
    Tensor pos = i32({0, 5, 17});
    Tensor inv_freq = Tensor::empty({R / 2}, DType::kF32);
    inv_freq.ptr<float>()[0] = 1.0f;
    inv_freq.ptr<float>()[1] = 0.1f;
    Tensor cache = Tensor::zeros({2, bs, 1, L + R}, DType::kF32);
    Tensor slots = i32({6, -1, 1});
    kernels::MlaRopeArgs a{H, N, R, L, 0.75f, interleaved};
    kernels::mla_rope_cache_write(q, kv, pos, inv_freq, a, cache, slots);
    const int p[] = {0, 5, 17};
    // Rotated (x1, x2) = s (x1 cos - x2 sin, x2 cos + x1 sin) for each pair of each rope part.
    auto expect_rotated = [&](const Tensor& got, const Tensor& was, int64_t t, int64_t base) {
      for (int i = 0; i < R / 2; ++i) {
        const double ang = p[t] * static_cast<double>(inv_freq.ptr<float>()[i]);
        const int64_t i1 = base + (interleaved ? 2 * i : i);
        const int64_t i2 = base + (interleaved ? 2 * i + 1 : i + R / 2);
        const int64_t w = got.size(1);
        const double x1 = at(was, t * w + i1), x2 = at(was, t * w + i2);
        EXPECT_NEAR(at(got, t * w + i1), 0.75 * (x1 * std::cos(ang) - x2 * std::sin(ang)), 1e-5);
        EXPECT_NEAR(at(got, t * w + i2), 0.75 * (x2 * std::cos(ang) + x1 * std::sin(ang)), 1e-5);
      }
    };
    for (int64_t t = 0; t < T; ++t) {
      for (int h = 0; h < H; ++h) {
        for (int d = 0; d < N; ++d)  // q_nope untouched
          EXPECT_EQ(at(q, t * H * (N + R) + h * (N + R) + d),
                    at(q0, t * H * (N + R) + h * (N + R) + d));
        expect_rotated(q, q0, t, h * (N + R) + N);
      }
      for (int d = 0; d < L; ++d) EXPECT_EQ(at(kv, t * (L + R) + d), at(kv0, t * (L + R) + d));
      expect_rotated(kv, kv0, t, L);
    }
    // Rows 0 and 2 land in slots 6 and 1; token 1 (slot -1) nowhere.
    for (int d = 0; d < L + R; ++d) {
      EXPECT_EQ(at(cache, 6 * (L + R) + d), at(kv, 0 * (L + R) + d));
      EXPECT_EQ(at(cache, 1 * (L + R) + d), at(kv, 2 * (L + R) + d));
    }
    float others = 0;
    for (int s = 0; s < 2 * bs; ++s)
      if (s != 6 && s != 1)
        for (int d = 0; d < L + R; ++d) others += std::abs(at(cache, s * (L + R) + d));
    EXPECT_EQ(others, 0.0f);
  }
}

// softmax_j(scale q_h · row_j) weighted sum of the first L channels, in double.
std::vector<double> direct_mla(const Tensor& q, const Tensor& cache, const PagedBatch& b, int s,
                               int64_t t, int h, int L, int R, double scale,
                               const std::vector<int>& keys) {
  const int W = L + R, bs = static_cast<int>(cache.size(1));
  std::vector<double> sc;
  double mx = -INFINITY;
  for (int j : keys) {
    const int64_t base = (static_cast<int64_t>(b.pages[s][j / bs]) * bs + j % bs) * W;
    double d = 0;
    for (int c = 0; c < W; ++c) d += at(q, t * q.size(1) + h * W + c) * at(cache, base + c);
    sc.push_back(d * scale);
    mx = std::max(mx, sc.back());
  }
  double den = 0;
  for (double& v : sc) den += (v = std::exp(v - mx));
  std::vector<double> o(L, 0.0);
  for (size_t k = 0; k < keys.size(); ++k) {
    const int j = keys[k];
    const int64_t base = (static_cast<int64_t>(b.pages[s][j / bs]) * bs + j % bs) * W;
    for (int c = 0; c < L; ++c) o[c] += sc[k] / den * at(cache, base + c);
  }
  return o;
}

TEST(MlaKernels, PagedAttentionOverLatentRowsIsCausalSoftmaxOfTheAbsorbedQuery) {
  const int H = 3, L = 8, R = 4, W = L + R, bs = 4;
  // A prefill chunk (5 new of 9), a decode (1 of 6), a full prefill (7 of 7).
  PagedBatch b = paged_batch({{5, 9}, {1, 6}, {7, 7}}, bs);
  const int T = 13;
  Tensor cache = random_cpu({b.num_pages, bs, 1, W}, DType::kF32, 3);
  Tensor q = random_cpu({T, H * W}, DType::kF32, 4);
  Tensor out = Tensor::empty({T, H * L}, DType::kF32);
  kernels::MlaArgs a{H, L, R, 0.37f, 7, 9};
  kernels::mla_paged_attention(out, q, cache, b.view(), Tensor(), a);
  const int qs[] = {0, 5, 6, 13}, cl[] = {9, 6, 7};
  for (int s = 0; s < 3; ++s)
    for (int t = qs[s]; t < qs[s + 1]; ++t) {
      const int idx = cl[s] - (qs[s + 1] - qs[s]) + (t - qs[s]);
      std::vector<int> keys;
      for (int j = 0; j <= idx; ++j) keys.push_back(j);
      for (int h = 0; h < H; ++h) {
        const auto want = direct_mla(q, cache, b, s, t, h, L, R, 0.37, keys);
        for (int c = 0; c < L; ++c) EXPECT_NEAR(at(out, t * H * L + h * L + c), want[c], 1e-5);
      }
    }
}

TEST(MlaKernels, SparseAttentionSeesOnlyTheSelectedPositions) {
  const int H = 2, L = 6, R = 2, W = L + R, bs = 4;
  PagedBatch b = paged_batch({{3, 10}}, bs);
  Tensor cache = random_cpu({b.num_pages, bs, 1, W}, DType::kF32, 5);
  Tensor q = random_cpu({3, H * W}, DType::kF32, 6);
  // Token 0 (index 7): positions 7, 2, 5; token 1 (index 8): 0 and two unused; token 2: 9 only.
  Tensor topk = i32({7, 2, 5, 0, -1, -1, -1, 9, -1}).view({3, 3});
  Tensor out = Tensor::empty({3, H * L}, DType::kF32);
  kernels::mla_paged_attention(out, q, cache, b.view(), topk, {H, L, R, 0.5f, 3, 10});
  const std::vector<std::vector<int>> keys = {{7, 2, 5}, {0}, {9}};
  for (int t = 0; t < 3; ++t)
    for (int h = 0; h < H; ++h) {
      const auto want = direct_mla(q, cache, b, 0, t, h, L, R, 0.5, keys[t]);
      for (int c = 0; c < L; ++c) EXPECT_NEAR(at(out, t * H * L + h * L + c), want[c], 1e-5);
    }
  // A position past the query's own index is a bug in the caller.
  Tensor bad = i32({8, -1, -1, 0, -1, -1, 9, -1, -1}).view({3, 3});
  EXPECT_ERROR_CONTAINS(
      kernels::mla_paged_attention(out, q, cache, b.view(), bad, {H, L, R, 0.5f, 3, 10}),
      "selects position 8");
}

TEST(MlaKernels, IndexerTopkScoresReluHeadsAndBreaksTiesByPosition) {
  const int Hi = 2, D = 4, K = 3, bs = 2;
  PagedBatch b = paged_batch({{2, 5}, {1, 2}}, bs);
  Tensor cache = random_cpu({b.num_pages, bs, 1, D}, DType::kF32, 7);
  // Sequence 1's two keys are equal: its query's scores tie.
  const int64_t p0 = b.pages[1][0];
  for (int d = 0; d < D; ++d)
    cache.ptr<float>()[(p0 * bs + 1) * D + d] = cache.ptr<float>()[p0 * bs * D + d];
  Tensor q = random_cpu({3, Hi * D}, DType::kF32, 8);
  Tensor w = random_cpu({3, Hi}, DType::kF32, 9, 0.1f, 1.0f);
  Tensor topk = Tensor::empty({3, K}, DType::kI32);
  kernels::indexer_topk(topk, q, w, cache, b.view(), {Hi, D, 0.5f, K, 2, 5});
  auto score = [&](int s, int64_t t, int j) {
    const int64_t base = (static_cast<int64_t>(b.pages[s][j / bs]) * bs + j % bs) * D;
    double sum = 0;
    for (int h = 0; h < Hi; ++h) {
      double dot = 0;
      for (int d = 0; d < D; ++d) dot += at(q, t * Hi * D + h * D + d) * at(cache, base + d);
      sum += at(w, t * Hi + h) * std::max(0.5 * dot, 0.0);
    }
    return sum;
  };
  const int32_t* got = topk.ptr<int32_t>();
  // Sequence 0: tokens at indices 3 and 4 see 4 and 5 positions; the best 3, best first.
  for (int t = 0; t < 2; ++t) {
    std::vector<int> order;
    for (int j = 0; j <= 3 + t; ++j) order.push_back(j);
    std::stable_sort(order.begin(), order.end(),
                     [&](int x, int y) { return score(0, t, x) > score(0, t, y); });
    for (int k = 0; k < K; ++k) EXPECT_EQ(got[t * K + k], order[k]) << "token " << t;
  }
  // Sequence 1: two visible positions with equal scores: both, the lower first, then -1.
  EXPECT_EQ(got[2 * K + 0], 0);
  EXPECT_EQ(got[2 * K + 1], 1);
  EXPECT_EQ(got[2 * K + 2], -1);
}

TEST(LayerNormKernel, MatchesTorchLayerNorm) {
  Tensor x = random_cpu({3, 5}, DType::kF32, 13, -2.0f, 3.0f);
  Tensor w = random_cpu({5}, DType::kF32, 14), bias = random_cpu({5}, DType::kF32, 15);
  Tensor out = Tensor::empty({3, 5}, DType::kF32);
  kernels::layer_norm(out, x, w, bias, 1e-6f);
  for (int r = 0; r < 3; ++r) {
    double mean = 0, var = 0;
    for (int i = 0; i < 5; ++i) mean += at(x, r * 5 + i) / 5.0;
    for (int i = 0; i < 5; ++i) var += (at(x, r * 5 + i) - mean) * (at(x, r * 5 + i) - mean) / 5.0;
    for (int i = 0; i < 5; ++i)
      EXPECT_NEAR(at(out, r * 5 + i),
                  (at(x, r * 5 + i) - mean) / std::sqrt(var + 1e-6) * at(w, i) + at(bias, i), 1e-5);
  }
  kernels::layer_norm(x, x, w, Tensor(), 1e-6f);  // in place, no bias
  for (int i = 0; i < 15; ++i) EXPECT_NEAR(at(x, i), at(out, i) - at(bias, i % 5), 1e-5);
}

TEST(MlaScale, YarnMscaleSquaredOnTheSoftmaxScale) {
  RopeConfig r;
  EXPECT_DOUBLE_EQ(mla_softmax_scale(24, r), 1.0 / std::sqrt(24.0));
  r.type = "yarn";
  r.factor = 4.0;
  EXPECT_DOUBLE_EQ(mla_softmax_scale(24, r), 1.0 / std::sqrt(24.0));  // no mscale_all_dim
  r.mscale_all_dim = 0.8;
  const double m = 0.1 * 0.8 * std::log(4.0) + 1.0;
  EXPECT_DOUBLE_EQ(mla_softmax_scale(24, r), m * m / std::sqrt(24.0));
  r.factor = 1.0;  // no extension: mscale 1
  EXPECT_DOUBLE_EQ(mla_softmax_scale(24, r), 1.0 / std::sqrt(24.0));
}

TEST(CacheKinds, EveryKindPagesThroughOneBlockTable) {
  const std::vector<CacheSpec> specs = {CacheSpec::key_value(2, 8, DType::kBF16, 4),
                                        CacheSpec::latent(576, DType::kBF16),
                                        CacheSpec::indexer_key(128, DType::kF32)};
  EXPECT_EQ(KvCache::page_bytes(specs, 16), 2u * 16 * 2 * 8 * 2 + 16u * 576 * 2 + 16u * 128 * 4);
  KvCache kv = KvCache::allocate(specs, 3, 16, Device::cpu());
  EXPECT_EQ(kv.key(0).shape(), (Shape{3, 16, 2, 8}));
  EXPECT_EQ(kv.value(0).shape(), (Shape{3, 16, 2, 8}));
  EXPECT_EQ(kv.plane(1, CacheKind::kLatent).shape(), (Shape{3, 16, 1, 576}));
  EXPECT_EQ(kv.plane(2, CacheKind::kIndexerKey).dtype(), DType::kF32);
  EXPECT_ERROR_CONTAINS(kv.value(1), "holds latent");
  EXPECT_ERROR_CONTAINS(kv.plane(0, CacheKind::kLatent), "holds key/value");
  EXPECT_ERROR_CONTAINS(kv.plane(5, CacheKind::kLatent), "layer cache 5 of 3");
}

// Every field of the list, set to distinct values: a copy carries them all.
TEST(BatchFields, CopiesAndValidationDeriveFromTheOneList) {
  Batch a;
  int32_t v = 1;
#define ATOM_TEST_FILL(name, extent) a.name = {v++, v++};
  ATOM_BATCH_FIELDS(ATOM_TEST_FILL)
#undef ATOM_TEST_FILL
  a.block_size = 8;
  Batch b;
  b.copy_host_from(a);
#define ATOM_TEST_SAME(name, extent) EXPECT_EQ(b.name, a.name) << #name;
  ATOM_BATCH_FIELDS(ATOM_TEST_SAME)
#undef ATOM_TEST_SAME
  EXPECT_EQ(b.block_size, 8);

  Batch c;  // one sequence of two new tokens over a context of 3
  c.token_ids = {5, 6};
  c.positions = {1, 2};
  c.query_start = {0, 2};
  c.context_lens = {3};
  c.slot_mapping = {1, 2};
  c.page_indptr = {0, 1};
  c.page_indices = {0};
  c.logits_indices = {1};
  c.block_size = 4;
  c.validate();
  c.state_slots = {0};
  c.validate();
  c.positions = {1};
  EXPECT_ERROR_CONTAINS(c.validate(), "positions has 1 entries, expected 2");
  c.positions = {1, 2};
  c.state_slots = {0, 1};
  EXPECT_ERROR_CONTAINS(c.validate(), "state_slots has 2 entries, expected 1");
}

}  // namespace
}  // namespace atom::test
