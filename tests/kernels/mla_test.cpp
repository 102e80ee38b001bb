// CUDA multi-head latent attention kernels against the CPU reference (kernels/mla.h): RoPE and
// the latent cache write, one-row cache writes, the indexer's LayerNorm, the per-head products,
// absorbed latent attention (the wgmma kernel at DeepSeek's 512 + 64 and GLM-5.3's 512 + 0, with
// and without context splits; the FP32 kernel for other widths), sparse attention over top-k lists,
// and the indexer's scores and top-k.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>

#include "gpu_util.h"
#include "kernels/cuda_tuning.h"
#include "kernels/layer_norm.h"
#include "kernels/linear.h"
#include "kernels/index_plane.h"
#include "kernels/mla.h"

namespace atom::test {
namespace {

Tensor i32_cpu(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::copy(v.begin(), v.end(), t.ptr<int32_t>());
  return t;
}

// A paged batch: sequence s has context ctx[s], of which its last qlen[s] tokens are new; its
// pages are a random choice of the pool's.
struct PagedBatch {
  std::vector<int32_t> query_start{0}, context_lens, page_indptr{0}, page_indices;
  int64_t num_pages = 0;
  int block_size = 0;
  Tensor qs, cl, pip, pid;  // CPU
  Tensor gqs, gcl, gpip, gpid;
  PagedBatch(const std::vector<int>& ctx, const std::vector<int>& qlen, int bs, uint32_t seed)
      : block_size(bs) {
    std::mt19937 rng(seed);
    int64_t need = 0;
    for (int c : ctx) need += (c + bs - 1) / bs;
    num_pages = need + 3;
    std::vector<int32_t> perm(static_cast<size_t>(num_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    size_t next = 0;
    for (size_t s = 0; s < ctx.size(); ++s) {
      query_start.push_back(query_start.back() + qlen[s]);
      context_lens.push_back(ctx[s]);
      for (int p = 0; p < (ctx[s] + bs - 1) / bs; ++p) page_indices.push_back(perm[next++]);
      page_indptr.push_back(static_cast<int32_t>(page_indices.size()));
    }
    qs = i32_cpu(query_start);
    cl = i32_cpu(context_lens);
    pip = i32_cpu(page_indptr);
    pid = i32_cpu(page_indices);
    gqs = qs.to(gpu());
    gcl = cl.to(gpu());
    gpip = pip.to(gpu());
    gpid = pid.to(gpu());
  }
  int64_t tokens() const { return query_start.back(); }
  int max_query_len() const {
    int m = 0;
    for (size_t s = 0; s + 1 < query_start.size(); ++s)
      m = std::max(m, query_start[s + 1] - query_start[s]);
    return m;
  }
  int max_context_len() const {
    return *std::max_element(context_lens.begin(), context_lens.end());
  }
  kernels::AttentionBatch cpu() const { return {&qs, &cl, &pip, &pid}; }
  kernels::AttentionBatch dev() const { return {&gqs, &gcl, &gpip, &gpid}; }
  // Context index of each token's query.
  std::vector<int> qpos() const {
    std::vector<int> r;
    for (size_t s = 0; s + 1 < query_start.size(); ++s) {
      const int q = query_start[s + 1] - query_start[s];
      for (int i = 0; i < q; ++i) r.push_back(context_lens[s] - q + i);
    }
    return r;
  }
};

// Random top-k lists: for each token up to K distinct visible positions, some entries -1.
Tensor random_topk(const PagedBatch& b, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  const auto qp = b.qpos();
  Tensor t = Tensor::empty({static_cast<int64_t>(qp.size()), K}, DType::kI32);
  for (size_t i = 0; i < qp.size(); ++i) {
    std::vector<int32_t> pos(static_cast<size_t>(qp[i] + 1));
    std::iota(pos.begin(), pos.end(), 0);
    std::shuffle(pos.begin(), pos.end(), rng);
    for (int k = 0; k < K; ++k) {
      int32_t v = k < static_cast<int>(pos.size()) ? pos[k] : -1;
      if (rng() % 11 == 0) v = -1;
      t.ptr<int32_t>()[i * K + k] = v;
    }
  }
  return t;
}

struct AttnCase {
  std::vector<int> ctx, qlen;
  int heads, latent, rope, block_size;
  DType dt;
  int top_k = 0;          // > 0: sparse
  bool workspace = true;  // split contexts where the kernel would
  int context_bound = 0;  // > 0: max_context_len passed as this bound (decode graphs)
  float q_range = 1.0f;
};

double run_attention_case(const AttnCase& c, uint64_t seed) {
  PagedBatch b(c.ctx, c.qlen, c.block_size, static_cast<uint32_t>(seed));
  const int W = c.latent + c.rope;
  const int64_t T = b.tokens();
  Tensor q =
      random_cpu({T, static_cast<int64_t>(c.heads) * W}, c.dt, seed + 1, -c.q_range, c.q_range);
  Tensor cache = random_cpu({b.num_pages, c.block_size, 1, W}, c.dt, seed + 2, -1, 1);
  Tensor topk = c.top_k > 0 ? random_topk(b, c.top_k, static_cast<uint32_t>(seed + 3)) : Tensor();
  kernels::MlaArgs a;
  a.num_heads = c.heads;
  a.latent_dim = c.latent;
  a.rope_dim = c.rope;
  a.scale = 1.0f / std::sqrt(192.0f);
  a.max_query_len = b.max_query_len();
  a.max_context_len = c.context_bound > 0 ? c.context_bound : b.max_context_len();
  Tensor ref = Tensor::empty({T, static_cast<int64_t>(c.heads) * c.latent}, DType::kF32);
  kernels::mla_paged_attention(ref, q, cache, b.cpu(), topk, a);
  Tensor out = Tensor::empty({T, static_cast<int64_t>(c.heads) * c.latent}, c.dt, gpu());
  poison(out);
  Tensor gtopk = topk.defined() ? topk.to(gpu()) : Tensor();
  kernels::AttentionBatch gb = b.dev();
  Tensor ws;
  const int64_t wsn = kernels::mla_paged_attention_workspace_size(gpu(), T, a, c.dt, c.top_k);
  if (c.workspace && wsn > 0) {
    ws = Tensor::empty({wsn}, DType::kF32, gpu());
    poison(ws);
    gb.workspace = &ws;
  }
  kernels::mla_paged_attention(out, q.to(gpu()), cache.to(gpu()), gb, gtopk, a);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return rel_err(out, ref);
}

TEST(GpuMla, WgmmaDecodeAndPrefillMatchTheCpu) {
  const DType bf = DType::kBF16;
  const std::vector<AttnCase> cases = {
      // DeepSeek-V3 decode: 128 heads, contexts across tile boundaries, split and not.
      {{1, 63, 64, 65, 300, 1000, 4100}, {1, 1, 1, 1, 1, 1, 1}, 128, 512, 64, 64, bf},
      {{1, 63, 64, 65, 300, 1000, 4100}, {1, 1, 1, 1, 1, 1, 1}, 128, 512, 64, 64, bf, 0, false},
      {{2000}, {1}, 128, 512, 64, 16, bf, 0, true, 32768},  // graph bound: many empty splits
      {{5, 2000, 777}, {1, 1, 1}, 16, 512, 64, 16, bf},     // V2-Lite's 16 heads
      {{3000, 129}, {1, 1}, 16, 512, 64, 64, bf, 0, true, 0, 4.0f},  // peaked softmax
      // Prefill and chunked prefill: packed (token, head) rows, causal inside a CTA.
      {{300, 50, 129}, {37, 50, 1}, 16, 512, 64, 64, bf},
      {{200, 70}, {3, 70}, 128, 512, 64, 16, bf},
      {{96, 33}, {96, 33}, 40, 512, 64, 64, DType::kF16},
      // GLM-5.3's rows without rope channels (512 wide, 64 heads): decode and prefill.
      {{1, 63, 64, 65, 300, 1000, 4100}, {1, 1, 1, 1, 1, 1, 1}, 64, 512, 0, 64, bf},
      {{300, 50, 129}, {37, 50, 1}, 64, 512, 0, 16, bf},
  };
  uint64_t seed = 1000;
  for (const int pipeline : {0, 1}) {
    const kernels::cuda::CudaTuningScope scope(kernels::cuda::cuda_tuning_with(
        [&](kernels::cuda::CudaTuning& t) { t.mla_pipeline = pipeline; }));
    for (const AttnCase& c : cases) {
      const double e = run_attention_case(c, seed += 10);
      std::printf("  pipeline %d, heads %d, %zu seqs (max ctx %d), splits %s: rel err %.3g\n",
                  pipeline, c.heads, c.ctx.size(), *std::max_element(c.ctx.begin(), c.ctx.end()),
                  c.workspace ? "allowed" : "off", e);
      EXPECT_LE(e, 6e-3) << "pipeline " << pipeline << ", heads " << c.heads << " seed " << seed;
    }
  }
}

TEST(GpuMla, SparseAttentionOverTopkMatchesTheCpu) {
  const DType bf = DType::kBF16;
  const std::vector<AttnCase> cases = {
      {{3000, 2100}, {1, 3}, 128, 512, 64, 64, bf, 256},
      {{5000}, {2}, 16, 512, 64, 16, bf, 2048},
      {{40, 9}, {40, 9}, 128, 512, 64, 64, bf, 64, false},
      {{3000, 2100}, {1, 3}, 64, 512, 0, 64, bf, 2063},  // GLM-5.3: 128 pools + a tail, no rope
      {{3000, 120}, {1, 4}, 4, 32, 8, 16, bf, 48},       // FP32 kernel
      {{700}, {5}, 8, 24, 8, 4, DType::kF32, 100},
  };
  uint64_t seed = 2000;
  for (const AttnCase& c : cases) {
    const double e = run_attention_case(c, seed += 10);
    std::printf("  sparse top %d, heads %d, latent %d: rel err %.3g\n", c.top_k, c.heads, c.latent,
                e);
    EXPECT_LE(e, c.dt == DType::kF32 ? 1e-5 : 6e-3) << "top " << c.top_k << " heads " << c.heads;
  }
}

TEST(GpuMla, Fp32KernelForOtherWidthsAndForcedSimple) {
  const std::vector<AttnCase> cases = {
      {{1, 17, 300}, {1, 17, 3}, 4, 32, 8, 4, DType::kBF16},
      {{50, 7}, {50, 1}, 4, 24, 8, 16, DType::kF32},
      {{129, 3}, {2, 3}, 3, 16, 16, 8, DType::kF16},
  };
  uint64_t seed = 3000;
  for (const AttnCase& c : cases) {
    const double e = run_attention_case(c, seed += 10);
    EXPECT_LE(e, c.dt == DType::kF32 ? 1e-5 : 4e-3) << "latent " << c.latent;
  }
  double e = 0;
  {
    const kernels::cuda::CudaTuningScope scope(
        kernels::cuda::cuda_tuning_with([](kernels::cuda::CudaTuning& t) { t.mla_simple = true; }));
    e = run_attention_case({{1, 65, 1000}, {1, 1, 4}, 128, 512, 64, 64, DType::kBF16}, 3100);
  }
  std::printf("  FP32 kernel at 128 x (512 + 64): rel err %.3g\n", e);
  EXPECT_LE(e, 4e-3);
}

TEST(GpuMla, RopeAndLatentCacheWriteMatchTheCpu) {
  for (const bool interleaved : {false, true}) {
    for (const DType dt : {DType::kBF16, DType::kF32}) {
      const int H = 16, N = 128, R = 64, L = 512;
      const int64_t T = 9, slots = 40;
      Tensor q = random_cpu({T, H * (N + R)}, dt, 11 + interleaved, -2, 2);
      Tensor kv = random_cpu({T, L + R}, dt, 12 + interleaved, -2, 2);
      Tensor cache = random_cpu({slots / 8, 8, 1, L + R}, dt, 13, -1, 1);
      std::vector<int32_t> pos, slot;
      for (int t = 0; t < T; ++t) {
        pos.push_back(37 * t * t + 5);
        slot.push_back(t == 4 ? -1 : (7 * t + 3) % static_cast<int>(slots));
      }
      Tensor p = i32_cpu(pos), sm = i32_cpu(slot);
      Tensor inv = Tensor::empty({R / 2}, DType::kF32);
      for (int i = 0; i < R / 2; ++i) inv.ptr<float>()[i] = std::pow(10000.0f, -2.0f * i / R);
      kernels::MlaRopeArgs a{H, N, R, L, 1.3f, interleaved};
      Tensor gq = q.to(gpu()), gkv = kv.to(gpu()), gc = cache.to(gpu());
      Tensor gp = p.to(gpu()), gsm = sm.to(gpu()), ginv = inv.to(gpu());
      kernels::mla_rope_cache_write(q, kv, p, inv, a, cache, sm);
      kernels::mla_rope_cache_write(gq, gkv, gp, ginv, a, gc, gsm);
      const double tol = dt == DType::kF32 ? 2e-6 : 2e-3;
      EXPECT_LE(rel_err(gq, q), tol) << "q, interleaved " << interleaved;
      EXPECT_LE(rel_err(gkv, kv), tol) << "kv";
      EXPECT_LE(rel_err(gc, cache), tol) << "cache";
      // q's nope channels and the latent c_kv are copied untouched.
      Tensor hq = host(gq);
      EXPECT_EQ(std::memcmp(hq.data(), q.data(), N * dtype_bytes(dt, 1)), 0);
    }
  }
}

TEST(GpuMla, CacheRowsWriteAndLayerNormMatchTheCpu) {
  const int64_t T = 13, D = 128, slots = 64;
  Tensor rows = random_cpu({T, 2 * D}, DType::kBF16, 21, -3, 3);
  Tensor rv = rows.narrow(1, D, D);  // strided rows
  std::vector<int32_t> slot;
  for (int t = 0; t < T; ++t) slot.push_back(t == 2 ? -1 : (5 * t + 1) % slots);
  Tensor sm = i32_cpu(slot);
  for (const DType ct : {DType::kBF16, DType::kF32}) {
    Tensor cache = random_cpu({slots / 16, 16, 1, D}, ct, 22, -1, 1);
    Tensor gc = cache.to(gpu());
    Tensor grows = rows.to(gpu());
    kernels::cache_rows_write(cache, rv, sm);
    Tensor grv = grows.narrow(1, D, D);
    Tensor gsm = sm.to(gpu());
    kernels::cache_rows_write(gc, grv, gsm);
    EXPECT_TRUE(same_bytes(gc, cache)) << dtype_name(ct);
  }
  for (const bool bias : {true, false}) {
    Tensor x = random_cpu({T, D}, DType::kBF16, 23 + bias, -4, 4);
    Tensor w = random_cpu({D}, DType::kBF16, 25, 0.5f, 1.5f);
    Tensor b = bias ? random_cpu({D}, DType::kBF16, 26, -1, 1) : Tensor();
    Tensor ref = x.clone();
    kernels::layer_norm(ref, ref, w, b, 1e-6f);
    Tensor g = x.to(gpu());
    Tensor gb = bias ? b.to(gpu()) : Tensor();
    kernels::layer_norm(g, g, w.to(gpu()), gb, 1e-6f);  // in place, as the indexer's k_norm
    EXPECT_LE(rel_err(g, ref), 3e-3) << "bias " << bias;
  }
}

TEST(GpuMla, PerHeadProductsMatchTheCpu) {
  // The absorbed W_UK (nope 128 -> latent 512 per head) and W_UV (latent 512 -> v 128).
  for (const int64_t M : {1, 3, 8}) {
    const int H = 16;
    const int64_t nope = 128, L = 512, qk = 192, v = 128;
    Tensor q = random_cpu({M, H * qk}, DType::kBF16, 31 + M, -1, 1);
    Tensor wuk = random_cpu({H, L, nope}, DType::kBF16, 32, -0.1f, 0.1f);
    Tensor ref = Tensor::empty({M, H * (L + 64)}, DType::kF32);
    for (int h = 0; h < H; ++h) {
      Tensor o = ref.narrow(1, h * (L + 64), L);
      kernels::linear(o, q.narrow(1, h * qk, nope), wuk.select(0, h));
    }
    Tensor gq = q.to(gpu()), gw = wuk.to(gpu());
    Tensor out = Tensor::empty({M, H * (L + 64)}, DType::kBF16, gpu());
    poison(out);
    Tensor o0 = out.narrow(1, 0, L);
    ASSERT_TRUE(
        kernels::linear_heads(o0, gq.narrow(1, 0, nope), gw.select(0, 0), H, L + 64, qk, L * nope));
    Tensor got = host(out), want = ref;
    for (int h = 0; h < H; ++h)
      EXPECT_LE(rel_err(got.narrow(1, h * (L + 64), L).contiguous(),
                        want.narrow(1, h * (L + 64), L).contiguous()),
                3e-3)
          << "W_UK head " << h << " M " << M;
    // W_UV: rows [h (nope + v) + nope, + v) of kv_b_proj [H (nope + v), L].
    Tensor lat = random_cpu({M, H * L}, DType::kBF16, 33 + M, -1, 1);
    Tensor kvb = random_cpu({H * (nope + v), L}, DType::kBF16, 34, -0.1f, 0.1f);
    Tensor ref2 = Tensor::empty({M, H * v}, DType::kF32);
    for (int h = 0; h < H; ++h) {
      Tensor o = ref2.narrow(1, h * v, v);
      kernels::linear(o, lat.narrow(1, h * L, L), kvb.narrow(0, h * (nope + v) + nope, v));
    }
    Tensor glat = lat.to(gpu()), gkvb = kvb.to(gpu());
    Tensor out2 = Tensor::empty({M, H * v}, DType::kBF16, gpu());
    poison(out2);
    Tensor o20 = out2.narrow(1, 0, v);
    ASSERT_TRUE(kernels::linear_heads(o20, glat.narrow(1, 0, L), gkvb.narrow(0, nope, v), H, v, L,
                                      (nope + v) * L));
    EXPECT_LE(rel_err(out2, ref2), 3e-3) << "W_UV M " << M;
  }
}

// The indexer: every GPU choice is a visible, distinct position whose score (recomputed here
// in double) is within rounding of the K-th best; the order descends; and most tokens' lists
// equal the CPU reference's exactly. With massive exact ties (few distinct key rows) the lists
// must equal the CPU's (ties: the lower position first).
struct IndexerCase {
  std::vector<int> ctx, qlen;
  int heads, dim, top_k, block_size;
  int distinct_keys = 0;  // > 0: key rows repeat this many distinct rows
};

void run_indexer_case(const IndexerCase& c, uint64_t seed) {
  PagedBatch b(c.ctx, c.qlen, c.block_size, static_cast<uint32_t>(seed));
  const int64_t T = b.tokens();
  const int Hi = c.heads, D = c.dim, K = c.top_k;
  Tensor q = random_cpu({T, static_cast<int64_t>(Hi) * D}, DType::kBF16, seed + 1, -1, 1);
  Tensor w = random_cpu({T, Hi}, DType::kF32, seed + 2, -1, 1);
  Tensor cache = random_cpu({b.num_pages, c.block_size, 1, D}, DType::kBF16, seed + 3, -1, 1);
  if (c.distinct_keys > 0) {
    const int64_t rowb = D * 2;
    char* p = static_cast<char*>(cache.data());
    for (int64_t r = c.distinct_keys; r < b.num_pages * c.block_size; ++r)
      std::memcpy(p + r * rowb, p + (r % c.distinct_keys) * rowb, rowb);
  }
  kernels::IndexerArgs a;
  a.num_heads = Hi;
  a.head_dim = D;
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  a.weights_scale = 1.0f / std::sqrt(static_cast<float>(Hi));
  a.top_k = K;
  a.max_query_len = b.max_query_len();
  a.max_context_len = b.max_context_len();
  Tensor ref = Tensor::empty({T, K}, DType::kI32);
  kernels::indexer_topk(ref, q, w, cache, b.cpu(), a);
  Tensor out = Tensor::empty({T, K}, DType::kI32, gpu());
  poison(out);
  Tensor ws =
      Tensor::empty({kernels::indexer_topk_workspace_size(gpu(), T, a)}, DType::kF32, gpu());
  kernels::AttentionBatch gb = b.dev();
  gb.workspace = &ws;
  Tensor gq = q.to(gpu()), gw = w.to(gpu()), gc = cache.to(gpu());
  kernels::indexer_topk(out, gq, gw, gc, gb, a);
  Tensor got = host(out);
  // Scores in double from the same bf16 inputs.
  const Tensor qf = to_f32_cpu(q), cf = to_f32_cpu(cache);
  const auto qp = b.qpos();
  int exact = 0;
  for (int64_t t = 0; t < T; ++t) {
    int s = 0;
    while (b.query_start[s + 1] <= t) ++s;
    const int n = qp[t] + 1;
    std::vector<double> score(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      const int64_t row =
          static_cast<int64_t>(b.page_indices[b.page_indptr[s] + j / c.block_size]) * c.block_size +
          j % c.block_size;
      double sum = 0;
      for (int h = 0; h < Hi; ++h) {
        double dot = 0;
        for (int d = 0; d < D; ++d)
          dot += static_cast<double>(qf.ptr<float>()[t * Hi * D + h * D + d]) *
                 cf.ptr<float>()[row * D + d];
        sum += w.ptr<float>()[t * Hi + h] * a.weights_scale * std::max(dot * a.scale, 0.0);
      }
      score[j] = sum;
    }
    std::vector<double> sorted = score;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    const int keep = std::min(n, K);
    const double kth = sorted[keep - 1], tol = 1e-4 * std::max(1.0, std::fabs(sorted[0]));
    const int32_t* g = got.ptr<int32_t>() + t * K;
    std::set<int32_t> seen;
    bool ok = true;
    for (int k = 0; k < K; ++k) {
      if (k >= keep) {
        ok &= g[k] == -1;
        continue;
      }
      ok &= g[k] >= 0 && g[k] < n && seen.insert(g[k]).second;
      if (!ok) break;
      ok &= score[g[k]] >= kth - tol;
      if (k > 0) ok &= score[g[k]] <= score[g[k - 1]] + tol;
    }
    EXPECT_TRUE(ok) << "token " << t << " of " << T << " (n " << n << ", top " << K << ")";
    if (!ok) break;
    exact += std::equal(g, g + K, ref.ptr<int32_t>() + t * K);
  }
  std::printf("  indexer %d heads of %d, top %d: %d of %lld tokens equal the CPU's lists\n", Hi, D,
              K, exact, static_cast<long long>(T));
  if (c.distinct_keys > 0)
    EXPECT_EQ(exact, T) << "exact ties must break by position as on the CPU";
  else
    EXPECT_GE(exact, static_cast<int>(0.9 * T));
}

TEST(GpuIndexer, ScoresAndTopkMatchTheCpu) {
  const std::vector<IndexerCase> cases = {
      {{3000, 2500, 40}, {1, 6, 40}, 64, 128, 2048, 64},  // V3.2's shape: n below and above K
      {{700, 90}, {12, 90}, 16, 16, 10, 4},               // the fixtures' shape
      {{1500}, {3}, 8, 64, 300, 16, 3},                   // three distinct scores: exact ties
      {{200}, {200}, 4, 32, 17, 16, 1},                   // one score for all
  };
  uint64_t seed = 4000;
  for (const IndexerCase& c : cases) run_indexer_case(c, seed += 10);
}

// DeepSeek-V4.1's index plane store (kernels/index_plane.h): a block per key on the GPU runs the
// CPU's row functions, so without RoPE the planes hold the same bytes; with RoPE the device's
// cosf / sinf may move a key by an ulp across a rounding boundary, so each decoded element must
// lie within two quantisation steps of the CPU's and few rows may differ at all.
TEST(GpuIndexPlane, StoreWritesTheCpuBytes) {
  const int64_t D = 128, pages = 40, rows_per_page = 16, n = 300;
  std::mt19937 rng(77);
  std::vector<int32_t> perm(static_cast<size_t>(pages * rows_per_page));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> rows(perm.begin(), perm.begin() + n), pos(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; e += 17) rows[static_cast<size_t>(e)] = -1;  // written nowhere
  for (auto& p : pos) p = static_cast<int32_t>(rng() % 100000);
  Tensor keys = random_cpu({n, D}, DType::kF32, 78, -3, 3);
  for (int64_t e = 0; e < n; e += 13)  // tiny rows: the FP8 scale's floor, FP4's smallest scales
    for (int64_t d = 0; d < D; ++d) keys.ptr<float>()[e * D + d] *= 1e-7f;
  const Tensor rows_t = i32_cpu(rows), pos_t = i32_cpu(pos);
  std::vector<float> inv(32);
  for (int i = 0; i < 32; ++i) inv[i] = std::pow(10000.0f, -static_cast<float>(i) / 32.0f);
  Tensor inv_t = Tensor::empty({32}, DType::kF32);
  std::copy(inv.begin(), inv.end(), inv_t.ptr<float>());
  for (const bool fp4 : {false, true})
    for (const int rot : {0, 64}) {
      const int64_t width = fp4 ? D / 2 : D + 4;
      kernels::IndexStoreArgs a;
      a.format = fp4 ? kernels::IndexKeyFormat::kFp4 : kernels::IndexKeyFormat::kFp8;
      a.head_dim = static_cast<int>(D);
      a.rot_dim = rot;
      a.attention_factor = 1.25f;
      Tensor cp = Tensor::zeros({pages, rows_per_page, 1, width}, DType::kU8);
      Tensor cs = fp4 ? Tensor::zeros({pages, rows_per_page, 1, D / 32}, DType::kU8) : Tensor();
      kernels::index_plane_store(cp, cs, keys, rows_t, pos_t, inv_t, a);
      Tensor gp = Tensor::zeros({pages, rows_per_page, 1, width}, DType::kU8).to(gpu());
      Tensor gs =
          fp4 ? Tensor::zeros({pages, rows_per_page, 1, D / 32}, DType::kU8).to(gpu()) : Tensor();
      kernels::index_plane_store(gp, gs, keys.to(gpu()), rows_t.to(gpu()), pos_t.to(gpu()),
                                 inv_t.to(gpu()), a);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const Tensor hp = host(gp), hs = fp4 ? host(gs) : Tensor();
      int rows_differ = 0;
      double worst = 0;
      for (int64_t r = 0; r < pages * rows_per_page; ++r) {
        const uint8_t* x = cp.ptr<uint8_t>() + r * width;
        const uint8_t* y = hp.ptr<uint8_t>() + r * width;
        bool same = std::equal(x, x + width, y);
        std::vector<float> vx(D), vy(D);
        if (fp4) {
          const uint8_t* sx = cs.ptr<uint8_t>() + r * (D / 32);
          const uint8_t* sy = hs.ptr<uint8_t>() + r * (D / 32);
          same = same && std::equal(sx, sx + D / 32, sy);
          kernels::index_fp4_load(x, sx, D, vx.data());
          kernels::index_fp4_load(y, sy, D, vy.data());
        } else {
          kernels::index_fp8_load(x, D, vx.data());
          kernels::index_fp8_load(y, D, vy.data());
        }
        rows_differ += !same;
        float amax = 0;
        for (float v : vx) amax = std::max(amax, std::fabs(v));
        for (int64_t d = 0; d < D; ++d)
          worst = std::max(worst, amax > 0 ? std::fabs(vx[d] - vy[d]) / amax
                                           : (std::fabs(vy[d]) > 0 ? 1.0 : 0.0));
      }
      std::printf("  index plane store %s, RoPE over %d: %d of %lld rows differ, worst element "
                  "%.3g of its row's amax\n",
                  fp4 ? "fp4" : "fp8", rot, rows_differ,
                  static_cast<long long>(pages * rows_per_page), worst);
      if (rot == 0) {
        EXPECT_EQ(rows_differ, 0);
      } else {
        EXPECT_LE(rows_differ, n / 10);
        EXPECT_LE(worst, fp4 ? 0.34 : 0.0725);  // two steps at the top of the format's range
      }
    }
}

// The indexer over DeepSeek-V4.1's quantised index planes against the CPU: the query rounded per
// head as the scorers take it, the keys read from FP8 rows (codes and a scale) or FP4 planes (codes
// and E8M0 scales), rows of `ratio` tokens; the candidate blocks it produces and, fed back, the
// ones that bound it; the large-position tie rule. Scores are summed in the same order on both
// sides from the same rounded inputs, so the lists must be equal but at near-ties (and at exact
// ties, from repeated keys, everywhere).
struct QuantIndexerCase {
  std::vector<int> ctx, qlen;
  int heads, dim, top_k, ratio, block_size;
  kernels::IndexKeyFormat format;
  int cand_block, cand_count;
  bool large = false;
  int distinct_keys = 0;  // > 0: the plane's rows repeat this many distinct rows
};

void run_quant_indexer_case(const QuantIndexerCase& c, uint64_t seed) {
  PagedBatch b(c.ctx, c.qlen, c.block_size, static_cast<uint32_t>(seed));
  const int64_t T = b.tokens(), rpp = c.block_size / c.ratio, nrows = b.num_pages * rpp;
  const int H = c.heads, D = c.dim, K = c.top_k;
  const bool fp4 = c.format == kernels::IndexKeyFormat::kFp4;
  const int64_t width = fp4 ? D / 2 : D + 4;
  // Every row of the plane written by the CPU store from random keys.
  Tensor keys = random_cpu({nrows, D}, DType::kF32, seed + 1, -2, 2);
  if (c.distinct_keys > 0)
    for (int64_t r = c.distinct_keys; r < nrows; ++r)
      std::copy(keys.ptr<float>() + (r % c.distinct_keys) * D,
                keys.ptr<float>() + (r % c.distinct_keys + 1) * D, keys.ptr<float>() + r * D);
  std::vector<int32_t> all(static_cast<size_t>(nrows)), zero(static_cast<size_t>(nrows), 0);
  std::iota(all.begin(), all.end(), 0);
  Tensor plane = Tensor::zeros({b.num_pages, rpp, 1, width}, DType::kU8);
  Tensor scales = fp4 ? Tensor::zeros({b.num_pages, rpp, 1, D / 32}, DType::kU8) : Tensor();
  kernels::IndexStoreArgs sa;
  sa.format = c.format;
  sa.head_dim = D;
  kernels::index_plane_store(plane, scales, keys, i32_cpu(all), i32_cpu(zero), Tensor(), sa);
  Tensor q = random_cpu({T, static_cast<int64_t>(H) * D}, DType::kF32, seed + 2, -1, 1);
  Tensor w = random_cpu({T, H}, DType::kF32, seed + 3, -1, 1);
  kernels::IndexerArgs a;
  a.num_heads = H;
  a.head_dim = D;
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  a.weights_scale = 1.0f / std::sqrt(static_cast<float>(H));
  a.top_k = K;
  a.max_query_len = b.max_query_len();
  a.max_context_len = std::max(1, b.max_context_len() / c.ratio);
  a.entry_tokens = c.ratio;
  a.key_format = c.format;
  a.large_position_first = c.large;
  a.candidate_block = c.cand_block;
  Tensor gplane = plane.to(gpu()), gscales = fp4 ? scales.to(gpu()) : Tensor();
  Tensor gq = q.to(gpu()), gw = w.to(gpu());
  Tensor ws =
      Tensor::empty({kernels::indexer_topk_workspace_size(gpu(), T, a)}, DType::kF32, gpu());
  kernels::AttentionBatch gb = b.dev();
  gb.workspace = &ws;
  const auto qp = b.qpos();
  // Pass 0 produces the candidates (unbounded); pass 1 is bounded by the CPU's.
  Tensor cand_cpu;
  for (int pass = 0; pass < 2; ++pass) {
    kernels::IndexerPlanes cp, gp;
    if (fp4) {
      cp.key_scales = &scales;
      gp.key_scales = &gscales;
    }
    Tensor cco, gco, gci;
    if (pass == 0) {
      cco = Tensor::empty({T, c.cand_count}, DType::kI32);
      gco = Tensor::empty({T, c.cand_count}, DType::kI32, gpu());
      poison(gco);
      cp.candidates_out = &cco;
      gp.candidates_out = &gco;
    } else {
      gci = cand_cpu.to(gpu());
      cp.candidates_in = &cand_cpu;
      gp.candidates_in = &gci;
    }
    Tensor ref = Tensor::empty({T, K}, DType::kI32);
    kernels::indexer_topk(ref, q, w, plane, b.cpu(), a, cp);
    Tensor out = Tensor::empty({T, K}, DType::kI32, gpu());
    poison(out);
    poison(ws);
    kernels::indexer_topk(out, gq, gw, gplane, gb, a, gp);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Tensor got = host(out), hco = pass == 0 ? host(gco) : Tensor();
    int exact = 0, formed = 0, cand_exact = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int32_t* g = got.ptr<int32_t>() + t * K;
      const int32_t* r = ref.ptr<int32_t>() + t * K;
      std::vector<int32_t> gs(g, g + K), rs(r, r + K);
      std::sort(gs.begin(), gs.end());
      std::sort(rs.begin(), rs.end());
      exact += gs == rs;
      // Well formed: distinct visible rows (inside the candidates on pass 1), as many as the
      // CPU's, then -1s.
      const int n = (qp[t] + 1) / c.ratio;
      std::set<int32_t> seen;
      int valid = 0;
      bool ok = true;
      for (int k = 0; k < K && ok; ++k) {
        if (g[k] < 0) continue;
        ++valid;
        ok = g[k] < n && seen.insert(g[k]).second;
        if (ok && pass == 1) {
          const int32_t* ci = cand_cpu.ptr<int32_t>() + t * c.cand_count;
          ok = std::find(ci, ci + c.cand_count, g[k] / c.cand_block) != ci + c.cand_count;
        }
      }
      ok = ok && valid == static_cast<int>(std::count_if(rs.begin(), rs.end(),
                                                         [](int32_t x) { return x >= 0; }));
      formed += ok;
      if (pass == 0)
        cand_exact += std::equal(hco.ptr<int32_t>() + t * c.cand_count,
                                 hco.ptr<int32_t>() + (t + 1) * c.cand_count,
                                 cco.ptr<int32_t>() + t * c.cand_count);
    }
    std::printf("  quantised indexer (%s, %d heads of %d, rows of %d, top %d, %s ties%s), pass "
                "%d: %d of %lld tokens equal the CPU's lists, %d well formed%s\n",
                fp4 ? "fp4" : "fp8", H, D, c.ratio, K, c.large ? "large-position" : "low-position",
                c.distinct_keys ? ", repeated keys" : "", pass, exact, static_cast<long long>(T),
                formed,
                pass == 0 ? (", candidates equal for " + std::to_string(cand_exact)).c_str() : "");
    EXPECT_EQ(formed, T) << "pass " << pass;
    if (c.distinct_keys > 0) {
      EXPECT_EQ(exact, T) << "exact ties must break by position as on the CPU, pass " << pass;
      if (pass == 0) {
        EXPECT_EQ(cand_exact, T);
      }
    } else {
      EXPECT_GE(exact, static_cast<int>(0.95 * T)) << "pass " << pass;
      if (pass == 0) {
        EXPECT_GE(cand_exact, static_cast<int>(0.95 * T));
      }
    }
    if (pass == 0) cand_cpu = cco;
  }
}

TEST(GpuIndexer, QuantisedPlanesAndCandidatesMatchTheCpu) {
  using F = kernels::IndexKeyFormat;
  const std::vector<QuantIndexerCase> cases = {
      // V4.1's shape: 64 heads of 128, rows of 2 tokens, top 512, blocks of 64 rows, 16 kept.
      {{6000, 2500, 90}, {1, 6, 90}, 64, 128, 512, 2, 64, F::kFp8, 64, 16},
      {{6000, 2500, 90}, {1, 6, 90}, 64, 128, 512, 2, 64, F::kFp4, 64, 16},
      // The fixture's shape: 4 heads of 32, rows of 1 and 2, top 4, blocks of 4, 2 kept.
      {{40, 23}, {40, 5}, 4, 32, 4, 1, 4, F::kFp8, 4, 2},
      {{40, 23}, {40, 5}, 4, 32, 4, 2, 4, F::kFp4, 4, 2, true},
      // Exact ties (repeated keys), both tie rules.
      {{700}, {9}, 8, 64, 40, 1, 16, F::kFp8, 8, 5, false, 3},
      {{700}, {9}, 8, 64, 40, 1, 16, F::kFp4, 8, 5, true, 3},
  };
  uint64_t seed = 5000;
  for (const QuantIndexerCase& c : cases) run_quant_indexer_case(c, seed += 10);
}

// The k-pool indexer (GLM-5.3): the pooled keys, the pools' scores, the top pools expanded to
// their positions and the incomplete tail pool, against the CPU. Inputs in F32 are scored in
// the same order on both sides (only exp differs), so the lists must be equal but for near-ties;
// with repeated rows (exact ties) they must be equal everywhere.
struct KpoolCase {
  std::vector<int> ctx, qlen;
  int heads, dim, pool, top_k, block_size;
  DType rows_dtype;
  bool tail = true;
  int distinct_rows = 0;  // > 0: cache rows repeat this many distinct rows
};

void run_kpool_case(const KpoolCase& c, uint64_t seed) {
  PagedBatch b(c.ctx, c.qlen, c.block_size, static_cast<uint32_t>(seed));
  const int64_t T = b.tokens();
  const int H = c.heads, D = c.dim, P = c.pool;
  Tensor q = random_cpu({T, static_cast<int64_t>(H) * D}, DType::kF32, seed + 1, -1, 1);
  Tensor w = random_cpu({T, H}, DType::kF32, seed + 2, -1, 1);
  Tensor cache = random_cpu({b.num_pages, c.block_size, 1, 2 * D}, c.rows_dtype, seed + 3, -2, 2);
  Tensor ape = random_cpu({P, D}, DType::kF32, seed + 4, -1, 1);
  if (c.distinct_rows > 0) {
    const int64_t rowb = 2 * D * (dtype_bits(c.rows_dtype) / 8);
    char* p = static_cast<char*>(cache.data());
    for (int64_t r = c.distinct_rows; r < b.num_pages * c.block_size; ++r)
      std::memcpy(p + r * rowb, p + (r % c.distinct_rows) * rowb, rowb);
    // ape varies by slot, so equal rows pool alike only if slots repeat too: zero it.
    std::fill(ape.ptr<float>(), ape.ptr<float>() + ape.numel(), 0.0f);
  }
  kernels::KpoolArgs a;
  a.num_heads = H;
  a.head_dim = D;
  a.pool = P;
  a.top_k = c.top_k;
  a.tail = c.tail;
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  a.weights_scale = 1.0f / std::sqrt(static_cast<float>(H));
  a.max_query_len = b.max_query_len();
  a.max_context_len = b.max_context_len();
  const int W = a.width();
  Tensor ref = Tensor::empty({T, W}, DType::kI32);
  kernels::kpool_topk(ref, q, w, cache, ape, b.cpu(), a);
  Tensor out = Tensor::empty({T, W}, DType::kI32, gpu());
  poison(out);
  Tensor ws = Tensor::empty(
      {kernels::kpool_topk_workspace_size(gpu(), T, static_cast<int64_t>(c.ctx.size()), a)},
      DType::kF32, gpu());
  poison(ws);
  kernels::AttentionBatch gb = b.dev();
  gb.workspace = &ws;
  kernels::kpool_topk(out, q.to(gpu()), w.to(gpu()), cache.to(gpu()), ape.to(gpu()), gb, a);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const Tensor got = host(out);
  const auto qp = b.qpos();
  int exact = 0, structural = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* g = got.ptr<int32_t>() + t * W;
    const int32_t* r = ref.ptr<int32_t>() + t * W;
    exact += std::equal(g, g + W, r);
    // Whatever the order of near-ties: the same count of whole pools, each a complete pool
    // visible to the token, distinct, then the tail, then -1.
    const int i = qp[t], n = (i + 1) / P, take = std::min(n, c.top_k / P);
    bool ok = true;
    std::set<int32_t> pools;
    for (int k = 0; k < take && ok; ++k) {
      const int32_t p0 = g[k * P];
      ok = p0 >= 0 && p0 % P == 0 && p0 / P < n && pools.insert(p0).second;
      for (int u = 1; u < P && ok; ++u) ok = g[k * P + u] == p0 + u;
    }
    int m = take * P;
    if (c.tail)
      for (int v = n * P; v <= i && ok; ++v) ok = g[m++] == v;
    for (; m < W && ok; ++m) ok = g[m] == -1;
    structural += ok;
  }
  std::printf("  k-pool %d heads of %d, pools of %d, top %d, %s rows: %d of %lld tokens equal "
              "the CPU's lists, %d well formed\n",
              H, D, P, c.top_k, std::string(dtype_name(c.rows_dtype)).c_str(), exact,
              static_cast<long long>(T), structural);
  EXPECT_EQ(structural, T);
  if (c.distinct_rows > 0)
    EXPECT_EQ(exact, T) << "exact ties must break by pool as on the CPU";
  else
    EXPECT_GE(exact, static_cast<int>(0.95 * T));
}

TEST(GpuKpool, PoolsScoresTopkAndTailMatchTheCpu) {
  const std::vector<KpoolCase> cases = {
      // The fixture's shape: 4 heads of 16, pools of 4, top 8 (2 pools); prefill and decode.
      {{90, 23, 7}, {90, 5, 1}, 4, 16, 4, 8, 4, DType::kF32},
      // GLM-5.3's: 32 heads of 128, pools of 16, top 2048 (128 pools): n below and above 128.
      {{3000, 1000, 37}, {1, 9, 37}, 32, 128, 16, 2048, 64, DType::kBF16},
      // Without the tail; a block size that is not a multiple of the pool.
      {{200, 61}, {20, 61}, 8, 32, 8, 64, 12, DType::kF32, false},
      // Exact ties between pools.
      {{400}, {6}, 4, 16, 4, 40, 16, DType::kF32, true, 4},
  };
  uint64_t seed = 7100;
  for (const KpoolCase& c : cases) run_kpool_case(c, seed += 10);
}

}  // namespace
}  // namespace atom::test
