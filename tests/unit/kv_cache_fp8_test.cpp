// The FP8 (e4m3) KV cache on the CPU reference kernels: the cache write stores e4m3(x / scale),
// and attention over an FP8 cache is exactly attention over a BF16 cache holding the dequantised
// values (code x scale; exact in BF16 for power-of-two scales): the same arithmetic on the same
// values, on ragged batches over shuffled pages, with windows, sinks and soft-cap.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/tensor_util.h"
#include "core/error.h"
#include "core/half.h"
#include "kernels/attention.h"
#include "kernels/random.h"
#include "kernels/rope.h"

namespace atom {
namespace {

using test::f32_or_bf16_at;
using test::i32;
using test::random_cpu;

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(KvCacheFp8, WriteStoresRoundedQuotientsAndSkipsNegativeSlots) {
  const int64_t pages = 5, bs = 4, hk = 2, D = 16, T = 13, width = hk * D;
  for (const kernels::KvScales sc : {kernels::KvScales{}, kernels::KvScales{0.37f, 3.0f}}) {
    // Values far past 448 (saturation) and far below 2^-9 (subnormals, zero) included.
    Tensor kv = random_cpu({T, 3 * width}, DType::kF32, 11, -600.0f, 600.0f);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < width; i += 3)
        kv.ptr<float>()[t * 3 * width + i] *= std::ldexp(1.0f, -14);
    Tensor k = kv.narrow(1, width, width), v = kv.narrow(1, 2 * width, width);  // strided rows
    Tensor kc = Tensor::empty({pages, bs, hk, D}, DType::kF8E4M3);
    Tensor vc = Tensor::empty({pages, bs, hk, D}, DType::kF8E4M3);
    std::memset(kc.data(), 0x55, kc.nbytes());
    std::memset(vc.data(), 0x55, vc.nbytes());
    std::vector<int32_t> slots(T);
    for (int64_t t = 0; t < T; ++t)
      slots[t] = t % 5 == 2 ? -1 : static_cast<int32_t>((t * 7) % (pages * bs));
    kernels::kv_cache_write(kc, vc, k, v, i32(slots), sc);
    std::vector<bool> written(pages * bs, false);
    for (int64_t t = 0; t < T; ++t) {
      if (slots[t] < 0) continue;
      written[slots[t]] = true;
      for (int64_t i = 0; i < width; ++i) {
        const float* kr = kv.ptr<float>() + t * 3 * width + width;
        ASSERT_EQ(kc.ptr<uint8_t>()[slots[t] * width + i], f32_to_f8e4m3(kr[i] / sc.k));
        ASSERT_EQ(vc.ptr<uint8_t>()[slots[t] * width + i], f32_to_f8e4m3(kr[width + i] / sc.v));
      }
    }
    for (int64_t s = 0; s < pages * bs; ++s) {
      if (written[s]) continue;
      for (int64_t i = 0; i < width; ++i) ASSERT_EQ(kc.ptr<uint8_t>()[s * width + i], 0x55);
    }
  }
}

struct Case {
  int heads, kv_heads, head_dim, block_size;
  std::vector<std::pair<int, int>> seqs;  // (new tokens, context)
  int window = 0;
  bool sinks = false;
  float softcap = 0.0f;
  DType act = DType::kF32;
  kernels::KvScales scales = {};
};

void check_fp8_equals_dequantised_bf16(const Case& c, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> qs = {0}, cl, pip = {0}, pid;
  int total_pages = 0, max_q = 0, max_c = 0;
  for (auto [q, ctx] : c.seqs) {
    qs.push_back(qs.back() + q);
    cl.push_back(ctx);
    const int pages = (ctx + c.block_size - 1) / c.block_size;
    total_pages += pages;
    pip.push_back(pip.back() + pages);
    max_q = std::max(max_q, q);
    max_c = std::max(max_c, ctx);
  }
  const int num_pages = total_pages + 2;
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  pid.assign(perm.begin(), perm.begin() + total_pages);
  const int64_t T = qs.back(), qw = static_cast<int64_t>(c.heads) * c.head_dim;
  const int64_t width = static_cast<int64_t>(c.kv_heads) * c.head_dim;
  const int64_t slots = static_cast<int64_t>(num_pages) * c.block_size;

  // Fill every slot of the FP8 cache through the cache write, from random keys and values.
  Tensor kc = Tensor::empty({num_pages, c.block_size, c.kv_heads, c.head_dim}, DType::kF8E4M3);
  Tensor vc = Tensor::empty(kc.shape(), DType::kF8E4M3);
  Tensor k = random_cpu({slots, width}, c.act, seed + 1, -3.0f, 3.0f);
  Tensor v = random_cpu({slots, width}, c.act, seed + 2, -3.0f, 3.0f);
  std::vector<int32_t> all(slots);
  std::iota(all.begin(), all.end(), 0);
  kernels::kv_cache_write(kc, vc, k, v, i32(all), c.scales);
  // The BF16 cache of the same values: code x scale.
  Tensor kb = Tensor::empty(kc.shape(), DType::kBF16), vb = Tensor::empty(kc.shape(), DType::kBF16);
  for (int64_t i = 0; i < kc.numel(); ++i) {
    const float kx = f8e4m3_to_f32(kc.ptr<uint8_t>()[i]) * c.scales.k;
    const float vx = f8e4m3_to_f32(vc.ptr<uint8_t>()[i]) * c.scales.v;
    ASSERT_EQ(bf16_to_f32(f32_to_bf16(kx)), kx);  // exact in BF16
    kb.ptr<uint16_t>()[i] = f32_to_bf16(kx);
    vb.ptr<uint16_t>()[i] = f32_to_bf16(vx);
  }

  Tensor q = random_cpu({T, qw}, c.act, seed + 3, -2.0f, 2.0f);
  Tensor sinks = c.sinks ? random_cpu({c.heads}, DType::kF32, seed + 4, -1.0f, 3.0f) : Tensor();
  kernels::AttentionArgs a;
  a.num_heads = c.heads;
  a.num_kv_heads = c.kv_heads;
  a.head_dim = c.head_dim;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  a.sliding_window = c.window;
  a.logit_softcap = c.softcap;
  a.max_query_len = max_q;
  a.max_context_len = max_c;
  Tensor tqs = i32(qs), tcl = i32(cl), tpip = i32(pip), tpid = i32(pid);
  kernels::AttentionBatch b{&tqs, &tcl, &tpip, &tpid};
  Tensor out8 = Tensor::empty({T, qw}, c.act), outb = Tensor::empty({T, qw}, c.act);
  kernels::AttentionArgs a8 = a;
  a8.kv_scales = c.scales;
  kernels::paged_attention(out8, q, kc, vc, b, sinks, a8);
  a.kv_scales = {5.0f, 7.0f};  // a BF16 cache ignores scales
  kernels::paged_attention(outb, q, kb, vb, b, sinks, a);
  EXPECT_TRUE(same_bytes(out8, outb)) << "H" << c.heads << "/" << c.kv_heads << " D" << c.head_dim;
  // And the FP8 cache is not the BF16 cache of the unquantised values: quantisation happened.
  double num = 0, den = 0;
  for (int64_t i = 0; i < slots * width; ++i) {
    const float x = f32_or_bf16_at(k, i);
    num += std::pow(x - f8e4m3_to_f32(kc.ptr<uint8_t>()[i]) * c.scales.k, 2);
    den += x * x;
  }
  const double rel = std::sqrt(num / den);
  EXPECT_GT(rel, 1e-3);
  EXPECT_LT(rel, 0.05);  // e4m3 keeps 3 mantissa bits: about 2-3% rms
}

TEST(KvCacheFp8, AttentionEqualsABf16CacheOfTheDequantisedValues) {
  const Case cases[] = {
      // Prefill, chunked prefill and decode rows in one batch; GQA 4.
      {8, 2, 32, 16, {{37, 37}, {9, 70}, {1, 55}, {1, 1}, {0, 5}}},
      // Scales (powers of two, so the dequantised values stay exact in BF16).
      {8, 2, 32, 16, {{20, 45}, {1, 90}}, 0, false, 0.0f, DType::kF32, {2.0f, 0.5f}},
      // Sliding window, sinks, soft-cap, small pages, BF16 activations.
      {4, 4, 64, 4, {{30, 41}, {1, 77}}, 13, true, 0.0f, DType::kF32, {0.25f, 4.0f}},
      {4, 1, 16, 8, {{17, 17}, {3, 29}}, 0, false, 20.0f, DType::kBF16},
      {6, 3, 128, 16, {{5, 40}, {1, 33}}, 0, true, 0.0f, DType::kBF16, {0.5f, 0.5f}},
  };
  uint64_t seed = 100;
  for (const Case& c : cases) check_fp8_equals_dequantised_bf16(c, seed += 10);
}

TEST(KvCacheFp8, FusedRopeWriteQuantisesTheRotatedKeys) {
  const int hq = 4, hk = 2, D = 32, T = 9;
  Tensor qkv = random_cpu({T, (hq + 2 * hk) * D}, DType::kF32, 300, -2.0f, 2.0f);
  Tensor pos = i32({0, 1, 2, 3, 4, 5, 6, 7, 8}), slots = i32({3, 4, 5, -1, 7, 8, 9, 10, 11});
  Tensor inv = Tensor::empty({D / 2}, DType::kF32);
  for (int i = 0; i < D / 2; ++i) inv.ptr<float>()[i] = 1.0f / std::pow(10000.0f, 2.0f * i / D);
  kernels::RopeArgs ra{D, D, 1.0f, false};
  const kernels::KvScales sc{0.5f, 2.0f};
  Tensor kc = Tensor::zeros({4, 4, hk, D}, DType::kF8E4M3),
         vc = Tensor::zeros(kc.shape(), DType::kF8E4M3);
  Tensor a = qkv.clone();
  Tensor q = a.narrow(1, 0, hq * D), k = a.narrow(1, hq * D, hk * D),
         v = a.narrow(1, (hq + hk) * D, hk * D);
  kernels::rope_kv_cache_write(q, k, v, pos, inv, ra, kc, vc, slots, sc);
  // The same as rope, then the cache write.
  Tensor kc2 = Tensor::zeros(kc.shape(), DType::kF8E4M3),
         vc2 = Tensor::zeros(kc.shape(), DType::kF8E4M3);
  Tensor b = qkv.clone();
  Tensor q2 = b.narrow(1, 0, hq * D), k2 = b.narrow(1, hq * D, hk * D),
         v2 = b.narrow(1, (hq + hk) * D, hk * D);
  kernels::rope(q2, k2, pos, inv, ra);
  kernels::kv_cache_write(kc2, vc2, k2, v2, slots, sc);
  EXPECT_TRUE(same_bytes(kc, kc2));
  EXPECT_TRUE(same_bytes(vc, vc2));
  EXPECT_TRUE(same_bytes(a, b));
}

TEST(KvCacheFp8, ScalesMustBePositive) {
  Tensor kc = Tensor::zeros({1, 4, 1, 8}, DType::kF8E4M3),
         vc = Tensor::zeros(kc.shape(), DType::kF8E4M3);
  Tensor k = Tensor::zeros({1, 8}, DType::kF32);
  EXPECT_THROW(kernels::kv_cache_write(kc, vc, k, k, i32({0}), {0.0f, 1.0f}), Error);
  EXPECT_THROW(kernels::kv_cache_write(kc, vc, k, k, i32({0}), {1.0f, -1.0f}), Error);
}

}  // namespace
}  // namespace atom
