// DeepSeek-V4's CUDA attention kernels (kernels/compressed_kv.h) against the CPU's code for the
// same step: the sink attention over the sliding window plus compressed entries (every complete
// entry, or a top-k list with unused slots) as models/deepseek_v4_parts.h's
// deepseek_v4_sink_attention computes it per query and head, the per-head norm and RoPE as
// layers/compressed_kv.h's rope_tail, and the indexer over rows of several tokens
// (IndexerArgs::entry_tokens) against the CPU indexer. F32 inputs give the kernels' own error;
// BF16 the model's dtype.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>

#include "gpu_util.h"
#include "kernels/compressed_kv.h"
#include "kernels/mla.h"
#include "layers/compressed_kv.h"
#include "models/deepseek_v4_parts.h"

namespace atom::test {
namespace {

Tensor ckv_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::copy(v.begin(), v.end(), t.ptr<int32_t>());
  return t;
}

// Sequences with contexts ctx[s], the last qlen[s] tokens new, in pages of bs tokens chosen at
// random from a pool.
struct CkvPages {
  std::vector<int32_t> qs{0}, cl, pip{0}, pid, pos;
  int64_t num_pages = 0;
  int bs = 0;
  Tensor g_qs, g_cl, g_pip, g_pid, g_pos, c_qs, c_cl, c_pip, c_pid;
  CkvPages(const std::vector<int>& ctx, const std::vector<int>& qlen, int block, uint32_t seed)
      : bs(block) {
    std::mt19937 rng(seed);
    for (int c : ctx) num_pages += (c + bs - 1) / bs;
    num_pages += 2;
    std::vector<int32_t> perm(static_cast<size_t>(num_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    size_t next = 0;
    for (size_t s = 0; s < ctx.size(); ++s) {
      qs.push_back(qs.back() + qlen[s]);
      cl.push_back(ctx[s]);
      for (int p = 0; p < (ctx[s] + bs - 1) / bs; ++p) pid.push_back(perm[next++]);
      pip.push_back(static_cast<int32_t>(pid.size()));
      for (int i = 0; i < qlen[s]; ++i) pos.push_back(ctx[s] - qlen[s] + i);
    }
    c_qs = ckv_i32(qs);
    c_cl = ckv_i32(cl);
    c_pip = ckv_i32(pip);
    c_pid = ckv_i32(pid);
    g_qs = c_qs.to(gpu());
    g_cl = c_cl.to(gpu());
    g_pip = c_pip.to(gpu());
    g_pid = c_pid.to(gpu());
    g_pos = ckv_i32(pos).to(gpu());
  }
  int64_t tokens() const { return qs.back(); }
  kernels::CompressedBatch dev() const {
    return {&g_qs, &g_cl, &g_pip, &g_pid, nullptr, &g_pos, bs};
  }
  // Sequence of token t.
  int seq(int64_t t) const {
    int s = 0;
    while (qs[static_cast<size_t>(s) + 1] <= t) ++s;
    return s;
  }
  PagedRows rows(int s, int tokens_per_row) const {
    return {pid.data() + pip[static_cast<size_t>(s)], bs, tokens_per_row};
  }
};

struct SinkCase {
  std::vector<int> ctx, qlen;
  int heads, dim, window, ratio, block, top_k;
  DType dt;
};

double run_sink_case(const SinkCase& c, uint32_t seed) {
  CkvPages b(c.ctx, c.qlen, c.block, seed);
  const int64_t T = b.tokens(), H = c.heads, D = c.dim;
  const int rpp = std::max(1, c.block / c.ratio);
  Tensor q = random_cpu({T, H * D}, c.dt, seed + 1, -1, 1);
  Tensor raw = random_cpu({b.num_pages, c.block, 1, D}, c.dt, seed + 2, -1, 1);
  Tensor ent = random_cpu({b.num_pages, rpp, 1, D}, c.dt, seed + 3, -1, 1);
  Tensor sinks = random_cpu({H}, DType::kF32, seed + 4, -1, 1);
  const Tensor qf = f32_host(q), rawf = f32_host(raw), entf = f32_host(ent);
  // Top-k lists over the complete entries, some slots unused.
  Tensor topk;
  std::mt19937 rng(seed + 5);
  if (c.top_k > 0) {
    topk = Tensor::empty({T, c.top_k}, DType::kI32);
    for (int64_t t = 0; t < T; ++t) {
      const int n = (b.pos[static_cast<size_t>(t)] + 1) / c.ratio;
      std::vector<int32_t> w(static_cast<size_t>(n));
      std::iota(w.begin(), w.end(), 0);
      std::shuffle(w.begin(), w.end(), rng);
      for (int k = 0; k < c.top_k; ++k)
        topk.ptr<int32_t>()[t * c.top_k + k] =
            k < n && rng() % 7 != 0 ? w[static_cast<size_t>(k)] : -1;
    }
  }
  // The CPU: the model's per-query core over the same keys.
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  Tensor want = Tensor::empty({T, H * D}, DType::kF32);
  for (int64_t t = 0; t < T; ++t) {
    const int s = b.seq(t), p = b.pos[static_cast<size_t>(t)];
    std::vector<const float*> keys;
    const PagedRows rr = b.rows(s, 1), er = b.rows(s, c.ratio);
    for (int k = std::max(0, p - c.window + 1); k <= p; ++k) keys.push_back(rr.row(rawf, k));
    if (c.top_k > 0) {
      for (int k = 0; k < c.top_k; ++k) {
        const int w = topk.ptr<int32_t>()[t * c.top_k + k];
        if (w >= 0) keys.push_back(er.row(entf, w));
      }
    } else {
      for (int w = 0; w < (p + 1) / c.ratio; ++w) keys.push_back(er.row(entf, w));
    }
    for (int64_t h = 0; h < H; ++h)
      deepseek_v4_sink_attention(qf.ptr<float>() + (t * H + h) * D, keys, D, sinks.ptr<float>()[h],
                                 scale, want.ptr<float>() + (t * H + h) * D);
  }
  Tensor out = Tensor::empty({T, H * D}, c.dt, gpu());
  poison(out);
  kernels::SinkAttentionArgs a;
  a.heads = c.heads;
  a.head_dim = c.dim;
  a.window = c.window;
  a.ratio = c.ratio;
  a.scale = scale;
  Tensor gtopk = topk.defined() ? topk.to(gpu()) : Tensor();
  kernels::sink_attention(out, q.to(gpu()), raw.to(gpu()), ent.to(gpu()), gtopk, sinks.to(gpu()),
                          b.dev(), a);
  CUDA_CHECK(cudaDeviceSynchronize());
  return rel_err(out, want);
}

TEST(GpuCompressedKv, SinkAttentionOverWindowAndEntriesMatchesCpu) {
  // Heads not a multiple of the kernel's group of 8, a width not a multiple of 32, windows of
  // entries within pages and across them, prefill beside decode, every entry or a top-k list.
  const std::vector<SinkCase> cases = {
      {{37, 20}, {3, 20}, 12, 40, 5, 4, 8, 0, DType::kF32},
      {{37, 20}, {3, 20}, 12, 40, 5, 4, 8, 3, DType::kF32},
      {{70, 9}, {70, 1}, 3, 64, 8, 16, 4, 0, DType::kF32},
      {{300, 41}, {1, 41}, 8, 512, 128, 4, 16, 16, DType::kF32},
      {{300, 41}, {1, 41}, 8, 512, 128, 4, 16, 16, DType::kBF16},
      {{37, 20}, {3, 20}, 12, 40, 5, 4, 8, 3, DType::kBF16},
  };
  uint32_t seed = 11;
  for (const SinkCase& c : cases) {
    const double e = run_sink_case(c, seed += 10);
    std::printf("sink attention %s H=%d D=%d window %d entries of %d top %d: rel err %.3g\n",
                std::string(dtype_name(c.dt)).c_str(), c.heads, c.dim, c.window, c.ratio, c.top_k,
                e);
    // Measured on the CPU side's own F32 order; BF16 rounds the output once.
    EXPECT_LE(e, c.dt == DType::kF32 ? 1e-5 : 1e-2);
  }
}

TEST(GpuCompressedKv, HeadsNormRopeMatchesCpu) {
  const int64_t T = 9, H = 5, D = 48, R = 16;
  CkvPages b({30}, {static_cast<int>(T)}, 16, 7);
  std::vector<float> inv(R / 2);
  for (int64_t i = 0; i < R / 2; ++i) inv[static_cast<size_t>(i)] = std::pow(1e4f, -2.0f * i / R);
  Tensor inv_t = Tensor::empty({R / 2}, DType::kF32);
  std::copy(inv.begin(), inv.end(), inv_t.ptr<float>());
  for (bool inverse : {false, true}) {
    Tensor x = random_cpu({T, H * D}, DType::kF32, 3, -2, 2);
    Tensor want = x.clone();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        float* v = want.ptr<float>() + (t * H + h) * D;
        if (!inverse) {
          double ss = 0;
          for (int64_t d = 0; d < D; ++d) ss += static_cast<double>(v[d]) * v[d];
          const float r = 1.0f / std::sqrt(static_cast<float>(ss / D) + 1e-6f);
          for (int64_t d = 0; d < D; ++d) v[d] *= r;
        }
        rope_tail(v, D, R, b.pos[static_cast<size_t>(t)], inv, 1.25f, inverse);
      }
    Tensor g = x.to(gpu());
    kernels::HeadsRopeArgs a;
    a.heads = static_cast<int>(H);
    a.head_dim = static_cast<int>(D);
    a.rot_dim = static_cast<int>(R);
    a.attention_factor = 1.25f;
    a.norm = !inverse;
    a.inverse = inverse;
    kernels::heads_norm_rope(g, inv_t.to(gpu()), b.dev(), a);
    CUDA_CHECK(cudaDeviceSynchronize());
    const double e = rel_err(g, want);
    std::printf("heads_norm_rope (%s): rel err %.3g\n", inverse ? "inverse" : "norm", e);
    EXPECT_LE(e, 2e-6);
  }
}

// The indexer over entry rows (one per 4 tokens, pages of 8 tokens: 2 rows a page) chooses as the
// CPU does: a token at context index i sees (i + 1) / 4 entries.
TEST(GpuCompressedKv, IndexerOverEntryRowsMatchesCpu) {
  const int Hi = 4, D = 32, K = 6, r = 4, bs = 8;
  CkvPages b({90, 33, 7, 61}, {2, 33, 7, 20}, bs, 5);
  const int64_t T = b.tokens();
  Tensor q = random_cpu({T, Hi * D}, DType::kF32, 21, -1, 1);
  Tensor w = random_cpu({T, Hi}, DType::kF32, 22, -1, 1);
  Tensor keys = random_cpu({b.num_pages, bs / r, 1, D}, DType::kF32, 23, -1, 1);
  kernels::IndexerArgs a;
  a.num_heads = Hi;
  a.head_dim = D;
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  a.weights_scale = 0.5f;
  a.top_k = K;
  a.max_query_len = 33;  // the batch's longest query
  a.max_context_len = 90 / r;
  a.entry_tokens = r;
  Tensor want = Tensor::empty({T, K}, DType::kI32);
  kernels::AttentionBatch cb{&b.c_qs, &b.c_cl, &b.c_pip, &b.c_pid};
  kernels::indexer_topk(want, q, w, keys, cb, a);
  kernels::AttentionBatch gb{&b.g_qs, &b.g_cl, &b.g_pip, &b.g_pid};
  Tensor ws =
      Tensor::empty({kernels::indexer_topk_workspace_size(gpu(), T, a)}, DType::kF32, gpu());
  gb.workspace = &ws;
  Tensor got = Tensor::empty({T, K}, DType::kI32, gpu());
  kernels::indexer_topk(got, q.to(gpu()), w.to(gpu()), keys.to(gpu()), gb, a);
  const Tensor gh = got.to(Device::cpu());
  int same = 0, full = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int n = (b.pos[static_cast<size_t>(t)] + 1) / r;
    full += n > K;
    bool eq = true;
    for (int k = 0; k < K; ++k) {
      const int32_t x = gh.ptr<int32_t>()[t * K + k], y = want.ptr<int32_t>()[t * K + k];
      eq = eq && x == y && x < std::max(n, 0) && (k < std::min(n, K) ? x >= 0 : x == -1);
    }
    same += eq;
  }
  std::printf("indexer over rows of %d tokens: %d of %lld tokens' lists equal (%d with more "
              "entries than %d)\n",
              r, same, static_cast<long long>(T), full, K);
  EXPECT_EQ(same, T);
  EXPECT_GT(full, 10);
}

// A verification step's rollback slots (CompressedBatch::rollback_slots) hold the windows in
// progress after each of its rows: one call over five rows (positions 0-4, CSA's overlapping
// windows of 4, so one window completes at row 3) against five calls of one row each, whose slot
// after each call is the state after that row; the completed entry alike.
TEST(GpuCompressedKv, WindowPoolRollbackSlotsHoldTheStateAfterEachRow) {
  const int D = 16, r = 4, n = 5, bs = 8;
  const int64_t W = 2 * D;
  Tensor kv = random_cpu({n, W}, DType::kF32, 31, -1, 1).to(gpu());
  Tensor gate = random_cpu({n, W}, DType::kF32, 32, -2, 2).to(gpu());
  Tensor ape = random_cpu({r, W}, DType::kF32, 33, -1, 1).to(gpu());
  Tensor nw = random_cpu({D}, DType::kF32, 34, 0.5f, 1.5f).to(gpu());
  Tensor inv = random_cpu({4}, DType::kF32, 35, 0.01f, 1.0f).to(gpu());
  kernels::WindowPoolArgs a;
  a.head_dim = D;
  a.ratio = r;
  a.overlap = true;
  a.rot_dim = 8;
  auto run = [&](Tensor& plane, Tensor& state, int first, int count, const Tensor* rollback) {
    CkvPages b({first + count}, {count}, bs, 1);
    for (int32_t& p : b.pid) p = 0;  // one page, page 0
    b.g_pid = ckv_i32(b.pid).to(gpu());
    Tensor slots = ckv_i32({0}).to(gpu());
    kernels::CompressedBatch cb = b.dev();
    cb.state_slots = &slots;
    cb.rollback_slots = rollback;
    Tensor scratch = Tensor::empty({count, D}, DType::kF32, gpu());
    kernels::window_pool(plane, state, scratch, kv.narrow(0, first, count),
                         gate.narrow(0, first, count), ape, nw, inv, cb, a);
  };
  Tensor plane_a = Tensor::zeros({1, bs / r, 1, D}, DType::kF32, gpu());
  Tensor state_a = Tensor::zeros({n + 1, 2, 3, D}, DType::kF32, gpu());
  Tensor rb = ckv_i32({1, 2, 3, 4, 5}).to(gpu());
  run(plane_a, state_a, 0, n, &rb);
  Tensor plane_b = Tensor::zeros({1, bs / r, 1, D}, DType::kF32, gpu());
  Tensor state_b = Tensor::zeros({n + 1, 2, 3, D}, DType::kF32, gpu());
  for (int i = 0; i < n; ++i) {
    run(plane_b, state_b, i, 1, nullptr);
    Tensor to = state_b.select(0, i + 1);
    to.copy_from(state_b.select(0, 0));
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  const Tensor sa = state_a.to(Device::cpu()), sb = state_b.to(Device::cpu());
  // A cleared window's running max is -inf on both sides (CSA's next window after row 3).
  double worst = 0;
  int cleared = 0;
  for (int64_t k = 0; k < sa.numel(); ++k) {
    const float x = sa.ptr<float>()[k], y = sb.ptr<float>()[k];
    if (std::isinf(x) || std::isinf(y)) {
      EXPECT_EQ(x, y) << "element " << k;
      cleared += std::isinf(y);
      continue;
    }
    worst = std::max(worst, std::abs(static_cast<double>(x) - y) / std::max(1.0f, std::abs(y)));
  }
  EXPECT_LE(worst, 1e-6);
  EXPECT_GT(cleared, 0);
  const double pe = rel_err(plane_a, plane_b);
  std::printf("window_pool rollback slots vs row-by-row: worst slot rel err %.3g, entries %.3g\n",
              worst, pe);
  EXPECT_LE(pe, 1e-6);
}

}  // namespace
}  // namespace atom::test
