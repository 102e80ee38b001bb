// The CPU paged attention against a direct softmax in double precision written here: ragged
// batches over shuffled pages, with contexts and query runs longer than the kernel's key tiles
// and query blocks (so the online softmax rescales across tiles and the items split a prompt),
// GQA, head sizes that are not a multiple of 8, sliding windows, sinks and soft-cap.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/tensor_util.h"
#include "core/half.h"
#include "kernels/attention.h"
#include "kernels/encoder.h"
#include "kernels/random.h"

namespace atom {
namespace {

using test::f32_or_bf16_at;
using test::i32;
using test::random_cpu;

struct AttnCase {
  int heads, kv_heads, head_dim, block_size;
  std::vector<std::pair<int, int>> seqs;  // (new tokens, context)
  int window = 0;
  bool sinks = false;
  float softcap = 0.0f;
  DType dtype = DType::kF32;  // of q, the caches and out
};

void check_attention(const AttnCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> qs = {0}, cl, pip = {0};
  int total_pages = 0;
  for (auto [n, ctx] : c.seqs) {
    qs.push_back(qs.back() + n);
    cl.push_back(ctx);
    const int pages = (ctx + c.block_size - 1) / c.block_size;
    total_pages += pages;
    pip.push_back(pip.back() + pages);
  }
  const int num_pages = total_pages + 3;
  std::vector<int32_t> pid(num_pages);
  std::iota(pid.begin(), pid.end(), 0);
  std::shuffle(pid.begin(), pid.end(), rng);
  pid.resize(total_pages);
  const int H = c.heads, Hk = c.kv_heads, D = c.head_dim, bs = c.block_size;
  const int64_t T = qs.back(), qw = static_cast<int64_t>(H) * D;
  Tensor kc = random_cpu({num_pages, bs, Hk, D}, c.dtype, seed + 1, -2.0f, 2.0f);
  Tensor vc = random_cpu({num_pages, bs, Hk, D}, c.dtype, seed + 2, -2.0f, 2.0f);
  // Queries as strided rows of a wider tensor, as the model's fused QKV gives them.
  Tensor qkv = random_cpu({T, qw + 5}, c.dtype, seed + 3, -2.0f, 2.0f);
  Tensor q = qkv.narrow(1, 3, qw);
  Tensor sinks = c.sinks ? random_cpu({H}, DType::kF32, seed + 4, -1.0f, 3.0f) : Tensor();
  kernels::AttentionArgs a;
  a.num_heads = H;
  a.num_kv_heads = Hk;
  a.head_dim = D;
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  a.sliding_window = c.window;
  a.logit_softcap = c.softcap;
  for (size_t s = 0; s < cl.size(); ++s) {
    a.max_query_len = std::max(a.max_query_len, qs[s + 1] - qs[s]);
    a.max_context_len = std::max(a.max_context_len, cl[s]);
  }
  Tensor tqs = i32(qs), tcl = i32(cl), tpip = i32(pip), tpid = i32(pid);
  kernels::AttentionBatch b{&tqs, &tcl, &tpip, &tpid};
  Tensor out = Tensor::empty({T, qw}, c.dtype);
  kernels::paged_attention(out, q, kc, vc, b, sinks, a);

  // Measured (2026-12-06): 6.2e-7 in F32; 3.4e-3 in BF16, the output's own rounding (2^-9).
  const double tol = c.dtype == DType::kF32 ? 2e-6 : 6e-3;
  double worst = 0;
  int checked = 0;
  for (size_t s = 0; s < cl.size(); ++s) {
    const int qlen = qs[s + 1] - qs[s];
    for (int r = 0; r < qlen; ++r) {
      const int64_t t = qs[s] + r;
      const int pos = cl[s] - qlen + r;
      const int lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
      for (int h = 0; h < H; ++h) {
        const int kvh = h / (H / Hk);
        auto elem = [&](int j, int d) {
          return (static_cast<int64_t>(pid[pip[s] + j / bs]) * bs + j % bs) * Hk * D +
                 static_cast<int64_t>(kvh) * D + d;
        };
        std::vector<double> logit;
        double mx = c.sinks ? f32_or_bf16_at(sinks, h) : -std::numeric_limits<double>::infinity();
        for (int j = lo; j <= pos; ++j) {
          double x = 0;
          for (int d = 0; d < D; ++d)
            x += static_cast<double>(
                     f32_or_bf16_at(q, t * (qw + 5) + static_cast<int64_t>(h) * D + d)) *
                 f32_or_bf16_at(kc, elem(j, d));
          x *= a.scale;
          if (c.softcap > 0) x = c.softcap * std::tanh(x / c.softcap);
          logit.push_back(x);
          mx = std::max(mx, x);
        }
        double den = c.sinks ? std::exp(f32_or_bf16_at(sinks, h) - mx) : 0.0;
        for (double& x : logit) den += (x = std::exp(x - mx));
        for (int d = 0; d < D; ++d) {
          double o = 0;
          for (int j = lo; j <= pos; ++j) o += logit[j - lo] * f32_or_bf16_at(vc, elem(j, d));
          o /= den;
          const double got = f32_or_bf16_at(out, t * qw + static_cast<int64_t>(h) * D + d);
          ASSERT_TRUE(std::isfinite(got)) << "token " << t << " head " << h;
          worst = std::max(worst, std::abs(got - o) / std::max(1.0, std::abs(o)));
          ++checked;
        }
      }
    }
  }
  EXPECT_LT(worst, tol) << "H" << H << "/" << Hk << " D" << D << " window " << c.window;
  EXPECT_EQ(checked, T * qw);
}

TEST(CpuPagedAttention, EqualsTheDirectSoftmax) {
  const AttnCase cases[] = {
      // A whole prompt of 150 (several query blocks and key tiles), a chunk of 70 over 300, a
      // decode over 200, and a one-token prompt; GQA 3, D 24.
      {6, 2, 24, 16, {{150, 150}, {70, 300}, {1, 200}, {1, 1}}},
      // Sliding window shorter than a tile and longer than one, with sinks; MHA; small pages.
      {4, 4, 16, 4, {{100, 130}, {1, 170}}, 40, true},
      {4, 4, 16, 8, {{90, 90}, {1, 300}}, 100, true},
      // Soft-cap, one kv head (MQA), D 40 (a tail after the 8-wide products).
      {8, 1, 40, 16, {{66, 129}, {2, 65}}, 0, false, 30.0f},
      // BF16 queries, caches and output.
      {4, 2, 32, 16, {{80, 100}, {1, 90}}, 0, true, 0.0f, DType::kBF16},
  };
  uint32_t seed = 500;
  for (const AttnCase& c : cases) check_attention(c, seed += 10);
}

// A NaN in one query row reaches that row's output and no other row's.
TEST(CpuPagedAttention, ANanQueryPoisonsOnlyItsRow) {
  const int H = 2, Hk = 1, D = 16, bs = 16, n = 100;
  Tensor kc = random_cpu({8, bs, Hk, D}, DType::kF32, 1, -1.0f, 1.0f);
  Tensor vc = random_cpu({8, bs, Hk, D}, DType::kF32, 2, -1.0f, 1.0f);
  Tensor q = random_cpu({n, H * D}, DType::kF32, 3, -1.0f, 1.0f);
  q.ptr<float>()[40 * H * D + 5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<int32_t> pages(7);
  std::iota(pages.begin(), pages.end(), 0);
  Tensor tqs = i32({0, n}), tcl = i32({n}), tpip = i32({0, 7}), tpid = i32(pages);
  kernels::AttentionBatch b{&tqs, &tcl, &tpip, &tpid};
  kernels::AttentionArgs a;
  a.num_heads = H;
  a.num_kv_heads = Hk;
  a.head_dim = D;
  a.scale = 0.25f;
  a.max_query_len = a.max_context_len = n;
  Tensor out = Tensor::empty({n, H * D}, DType::kF32);
  kernels::paged_attention(out, q, kc, vc, b, Tensor(), a);
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < H * D; ++i) {
      const bool nan_expected = t == 40 && i < D;  // head 0 of token 40
      EXPECT_EQ(std::isnan(out.ptr<float>()[t * H * D + i]), nan_expected) << t << " " << i;
    }
}

// Non-causal paged attention (AttentionArgs::causal off) equals the encoder's attention, an
// independent loop, when each sequence's keys are its own rows: two sequences over shuffled pages
// of 4 tokens, head_dim 72.
TEST(CpuPagedAttention, NonCausalEqualsTheEncodersAttention) {
  const int H = 3, D = 72, Q = H * D;
  const std::vector<int64_t> starts{0, 11, 30};
  const int64_t T = starts.back();
  const Tensor qkv = test::random_cpu({T, 3 * Q}, DType::kF32, 77, -2.0f, 2.0f);
  kernels::EncoderAttention ea{H, D, 0.2f};
  Tensor want = Tensor::empty({T, Q}, DType::kF32);
  Arena arena(Device::cpu());
  kernels::encoder_attention(want, qkv, starts, ea, arena);
  // Pages of 4 tokens, token t of the batch in slot perm[t / 4] * 4 + t % 4 of its sequence's
  // pages.
  const int bs = 4, pages = 12;
  Tensor kc = Tensor::zeros({pages, bs, H, D}, DType::kF32), vc = kc.clone();
  std::vector<int32_t> qs, cl, pip{0}, pid;
  int next = pages - 1;
  for (size_t s = 0; s + 1 < starts.size(); ++s) {
    const int64_t s0 = starts[s], len = starts[s + 1] - s0;
    qs.push_back(static_cast<int32_t>(s0));
    cl.push_back(static_cast<int32_t>(len));
    for (int64_t p = 0; p < (len + bs - 1) / bs; ++p) pid.push_back(next--);
    pip.push_back(static_cast<int32_t>(pid.size()));
    for (int64_t j = 0; j < len; ++j) {
      const int64_t page = pid[static_cast<size_t>(pip[s] + j / bs)], slot = page * bs + j % bs;
      for (int64_t c = 0; c < Q; ++c) {
        kc.ptr<float>()[slot * Q + c] = qkv.ptr<float>()[(s0 + j) * 3 * Q + Q + c];
        vc.ptr<float>()[slot * Q + c] = qkv.ptr<float>()[(s0 + j) * 3 * Q + 2 * Q + c];
      }
    }
  }
  qs.push_back(static_cast<int32_t>(T));
  kernels::AttentionArgs a;
  a.num_heads = H;
  a.num_kv_heads = H;
  a.head_dim = D;
  a.scale = 0.2f;
  a.causal = false;
  a.max_query_len = 19;
  a.max_context_len = 19;
  Tensor tqs = test::i32(qs), tcl = test::i32(cl), tpip = test::i32(pip), tpid = test::i32(pid);
  const kernels::AttentionBatch b{&tqs, &tcl, &tpip, &tpid};
  Tensor got = Tensor::empty({T, Q}, DType::kF32);
  kernels::paged_attention(got, qkv.narrow(1, 0, Q), kc, vc, b, Tensor(), a);
  float worst = 0;
  for (int64_t i = 0; i < T * Q; ++i)
    worst = std::max(worst, std::abs(got.ptr<float>()[i] - want.ptr<float>()[i]));
  EXPECT_LE(worst, 1e-5f);
  // The causal mask would change every row but each sequence's last.
  a.causal = true;
  kernels::paged_attention(got, qkv.narrow(1, 0, Q), kc, vc, b, Tensor(), a);
  EXPECT_GT(std::abs(got.ptr<float>()[0] - want.ptr<float>()[0]), 1e-3f);
}

}  // namespace
}  // namespace atom
