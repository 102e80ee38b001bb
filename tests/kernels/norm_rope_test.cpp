// CUDA rms_norm, rope and kv_cache_write against the CPU reference.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>

#include "gpu_util.h"
#include "kernels/attention.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"

namespace atom::test {
namespace {

struct NormCase {
  int64_t rows, width, dim;
  DType dt;
  bool residual;
  kernels::RmsNormKind kind;
};

TEST(GpuRmsNorm, RowsGroupsResidualAndKinds) {
  using K = kernels::RmsNormKind;
  const NormCase cases[] = {
      {1, 4096, 4096, DType::kBF16, true, K::kLlama},
      {7, 4096, 4096, DType::kBF16, false, K::kLlama},
      {33, 1000, 1000, DType::kBF16, true, K::kLlama},
      {5, 96, 96, DType::kF32, true, K::kLlama},
      {9, 4096, 128, DType::kBF16, false, K::kLlama},
      {3, 1000, 40, DType::kF32, false, K::kGemma},
      {17, 2048, 2048, DType::kF16, true, K::kGemma},
      {4, 100, 100, DType::kBF16, true, K::kLlama},
  };
  uint64_t seed = 10;
  for (const NormCase& c : cases) {
    Tensor x = random_cpu({c.rows, c.width}, c.dt, ++seed, -3, 3);
    Tensor res = random_cpu({c.rows, c.width}, c.dt, ++seed, -3, 3);
    Tensor w = random_cpu({c.dim}, c.dt, ++seed, 0.5f, 1.5f);
    Tensor ref = Tensor::empty({c.rows, c.width}, c.dt);
    Tensor ref_res = res.clone();
    kernels::rms_norm(ref, x, c.residual ? &ref_res : nullptr, w, 1e-5f, c.kind);
    Tensor out = Tensor::empty({c.rows, c.width}, c.dt, gpu());
    poison(out);
    Tensor gres = res.to(gpu());
    kernels::rms_norm(out, x.to(gpu()), c.residual ? &gres : nullptr, w.to(gpu()), 1e-5f, c.kind);
    const double tol = c.dt == DType::kF32 ? 1e-6 : 2e-3;
    EXPECT_LE(rel_err(out, ref), tol) << c.rows << "x" << c.width << "/" << c.dim;
    if (c.residual) {
      EXPECT_TRUE(same_bytes(gres, ref_res)) << "residual " << c.rows << "x" << c.width;
    }
  }
}

TEST(GpuRmsNorm, PerHeadInPlaceOnStridedView) {
  // q of a fused qkv row [T, (32 + 2 * 8) * 128]: per-head norm over 128, in place.
  const int64_t T = 11, D = 128, width = 48 * D;
  Tensor qkv = random_cpu({T, width}, DType::kBF16, 77, -2, 2);
  Tensor w = random_cpu({D}, DType::kBF16, 78, 0.5f, 1.5f);
  Tensor ref = qkv.clone();
  Tensor rq = ref.narrow(1, 0, 32 * D);
  kernels::rms_norm(rq, rq, nullptr, w, 1e-6f);
  Tensor g = qkv.to(gpu());
  Tensor gq = g.narrow(1, 0, 32 * D);
  kernels::rms_norm(gq, gq, nullptr, w.to(gpu()), 1e-6f);
  EXPECT_LE(rel_err(g, ref), 2e-3);
  // The untouched k and v columns stay bit-identical.
  Tensor back = g.to(Device::cpu());
  for (int64_t t = 0; t < T; ++t)
    EXPECT_EQ(std::memcmp(static_cast<char*>(back.data()) + (t * width + 32 * D) * 2,
                          static_cast<char*>(qkv.data()) + (t * width + 32 * D) * 2, 16 * D * 2),
              0);
}

TEST(GpuRope, HalvesInterleavedPartialStrided) {
  struct Case {
    int head_dim, rot_dim;
    bool interleaved;
    DType dt;
    float scale;
  };
  const Case cases[] = {{128, 128, false, DType::kBF16, 1.0f},
                        {64, 64, true, DType::kF32, 1.0f},
                        {128, 64, false, DType::kF32, 1.2f},
                        {80, 40, true, DType::kBF16, 1.0f},
                        {32, 32, false, DType::kF16, 0.9f}};
  uint64_t seed = 100;
  for (const Case& c : cases) {
    const int hq = 8, hk = 2;
    const int64_t T = 37, width = (hq + 2 * hk) * c.head_dim;
    Tensor qkv = random_cpu({T, width}, c.dt, ++seed, -2, 2);
    Tensor pos = Tensor::empty({T}, DType::kI32);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    for (int64_t t = 0; t < T; ++t) pos.ptr<int32_t>()[t] = static_cast<int32_t>(rng() % 9000);
    Tensor inv = Tensor::empty({c.rot_dim / 2}, DType::kF32);
    for (int i = 0; i < c.rot_dim / 2; ++i)
      inv.ptr<float>()[i] = 1.0f / std::pow(500000.0f, 2.0f * i / static_cast<float>(c.rot_dim));
    kernels::RopeArgs a{c.head_dim, c.rot_dim, c.scale, c.interleaved};
    Tensor ref = qkv.clone();
    Tensor rq = ref.narrow(1, 0, hq * c.head_dim),
           rk = ref.narrow(1, hq * c.head_dim, hk * c.head_dim);
    kernels::rope(rq, rk, pos, inv, a);
    Tensor g = qkv.to(gpu());
    Tensor gq = g.narrow(1, 0, hq * c.head_dim), gk = g.narrow(1, hq * c.head_dim, hk * c.head_dim);
    Tensor gpos = pos.to(gpu()), ginv = inv.to(gpu());
    kernels::rope(gq, gk, gpos, ginv, a);
    EXPECT_LE(rel_err(g, ref), c.dt == DType::kF32 ? 2e-6 : 2e-3) << c.head_dim << "/" << c.rot_dim;
  }
}

TEST(GpuKvCacheWrite, SlotsSkipsAndStridedSources) {
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const int64_t pages = 9, bs = 16, hk = 2, D = 64, T = 40;
    Tensor kc = random_cpu({pages, bs, hk, D}, dt, 200),
           vc = random_cpu({pages, bs, hk, D}, dt, 201);
    Tensor qkv = random_cpu({T, 3 * hk * D}, dt, 202);
    Tensor k = qkv.narrow(1, hk * D, hk * D), v = qkv.narrow(1, 2 * hk * D, hk * D);
    Tensor slots = Tensor::empty({T}, DType::kI32);
    std::vector<int32_t> perm(pages * bs);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
    for (int64_t t = 0; t < T; ++t) slots.ptr<int32_t>()[t] = t % 7 == 3 ? -1 : perm[t];
    Tensor gk = kc.to(gpu()), gv = vc.to(gpu());
    Tensor g = qkv.to(gpu());
    Tensor gks = g.narrow(1, hk * D, hk * D), gvs = g.narrow(1, 2 * hk * D, hk * D);
    Tensor gslots = slots.to(gpu());
    kernels::kv_cache_write(kc, vc, k, v, slots);
    kernels::kv_cache_write(gk, gv, gks, gvs, gslots);
    EXPECT_TRUE(same_bytes(gk, kc)) << dtype_name(dt);
    EXPECT_TRUE(same_bytes(gv, vc)) << dtype_name(dt);
  }
}

// Inputs of the fused RoPE + cache write tests: positions 100 + 3t, cache slots 7t (mod
// num_slots) with token 5's skipped, and inverse frequencies of base 10,000 over head_dim D.
struct RopeWriteInputs {
  Tensor pos, slots, inv;
};
RopeWriteInputs rope_write_inputs(int T, int D, int num_slots) {
  RopeWriteInputs r{Tensor::empty({T}, DType::kI32), Tensor::empty({T}, DType::kI32),
                    Tensor::empty({D / 2}, DType::kF32)};
  for (int t = 0; t < T; ++t) {
    r.pos.ptr<int32_t>()[t] = 100 + 3 * t;
    r.slots.ptr<int32_t>()[t] = t == 5 ? -1 : (t * 7) % num_slots;
  }
  for (int i = 0; i < D / 2; ++i) r.inv.ptr<float>()[i] = 1.0f / std::pow(10000.0f, 2.0f * i / D);
  return r;
}

TEST(GpuRope, FusedWithCacheWriteMatchesRopeThenWrite) {
  struct Case {
    DType dt;
    int hq, hk, D;
  };
  // BF16/F16 full-head rotation takes the vectorised kernel; 128 + 16 heads of 128 need more
  // 16-byte words (1,408) than a block has threads.
  for (const Case& c : {Case{DType::kBF16, 8, 2, 64}, Case{DType::kF32, 8, 2, 64},
                        Case{DType::kF16, 32, 8, 128}, Case{DType::kBF16, 128, 16, 128}}) {
    const DType dt = c.dt;
    const int hq = c.hq, hk = c.hk, D = c.D, T = 29, pages = 4, bs = 16;
    const int64_t width = (hq + 2 * hk) * D;
    Tensor qkv = random_cpu({T, width}, dt, 400, -2, 2);
    Tensor kc = random_cpu({pages, bs, hk, D}, dt, 401),
           vc = random_cpu({pages, bs, hk, D}, dt, 402);
    const auto [pos, slots, inv] = rope_write_inputs(T, D, pages * bs);
    kernels::RopeArgs a{D, D, 1.0f, false};
    Tensor ref = qkv.clone();
    Tensor rq = ref.narrow(1, 0, hq * D), rk = ref.narrow(1, hq * D, hk * D),
           rv = ref.narrow(1, (hq + hk) * D, hk * D);
    kernels::rope_kv_cache_write(rq, rk, rv, pos, inv, a, kc, vc, slots);  // CPU: rope, then write
    Tensor g = qkv.to(gpu());
    Tensor gq = g.narrow(1, 0, hq * D), gk = g.narrow(1, hq * D, hk * D),
           gv = g.narrow(1, (hq + hk) * D, hk * D);
    Tensor gkc = random_cpu({pages, bs, hk, D}, dt, 401).to(gpu()),
           gvc = random_cpu({pages, bs, hk, D}, dt, 402).to(gpu());
    Tensor gpos = pos.to(gpu()), ginv = inv.to(gpu()), gslots = slots.to(gpu());
    kernels::rope_kv_cache_write(gq, gk, gv, gpos, ginv, a, gkc, gvc, gslots);
    const double tol = dt == DType::kF32 ? 2e-6 : 2e-3;
    EXPECT_LE(rel_err(g, ref), tol) << dtype_name(dt);
    EXPECT_LE(rel_err(gkc, kc), tol) << dtype_name(dt);
    EXPECT_TRUE(same_bytes(gvc, vc)) << dtype_name(dt);
  }
}

// Per-head q/k norms before RoPE and the cache write (Qwen3's q_norm and k_norm) against the CPU
// reference, which runs rms_norm on q and on k, then rope, then the write. The vectorised kernel
// fuses them where a head's lanes divide a warp (head_dim 64, 128 and 256 here); head_dim 96
// (6 lanes a head), partial rotation and F32 take two norm kernels first.
TEST(GpuRope, QkNormsThenRopeAndCacheWriteMatchTheCpu) {
  using K = kernels::RmsNormKind;
  struct Case {
    DType dt;
    int hq, hk, D, rot;
    K kind;
  };
  for (const Case& c :
       {Case{DType::kBF16, 32, 4, 128, 128, K::kLlama},  // Qwen3-30B-A3B
        Case{DType::kF16, 8, 2, 64, 64, K::kLlama}, Case{DType::kBF16, 16, 2, 256, 256, K::kGemma},
        Case{DType::kBF16, 128, 16, 128, 128, K::kLlama},  // a loop of the block
        Case{DType::kBF16, 8, 2, 96, 96, K::kLlama}, Case{DType::kBF16, 8, 2, 128, 64, K::kGemma},
        Case{DType::kF32, 8, 2, 64, 64, K::kLlama}}) {
    const DType dt = c.dt;
    const int hq = c.hq, hk = c.hk, D = c.D, T = 29, pages = 4, bs = 16;
    const int64_t width = (hq + 2 * hk) * D;
    Tensor qkv = random_cpu({T, width}, dt, 420, -2, 2);
    Tensor qw = random_cpu({D}, dt, 421, 0.5f, 1.5f), kw = random_cpu({D}, dt, 422, 0.5f, 1.5f);
    Tensor kc = random_cpu({pages, bs, hk, D}, dt, 423),
           vc = random_cpu({pages, bs, hk, D}, dt, 424);
    const auto [pos, slots, inv] = rope_write_inputs(T, c.rot, pages * bs);
    const kernels::RopeArgs a{D, c.rot, 1.0f, false};
    Tensor ref = qkv.clone();
    Tensor rq = ref.narrow(1, 0, hq * D), rk = ref.narrow(1, hq * D, hk * D),
           rv = ref.narrow(1, (hq + hk) * D, hk * D);
    const kernels::QkNorm norm{&qw, &kw, 1e-6f, c.kind};
    kernels::rope_kv_cache_write(rq, rk, rv, pos, inv, a, kc, vc, slots, {}, &norm);
    Tensor g = qkv.to(gpu());
    Tensor gq = g.narrow(1, 0, hq * D), gk = g.narrow(1, hq * D, hk * D),
           gv = g.narrow(1, (hq + hk) * D, hk * D);
    Tensor gkc = random_cpu({pages, bs, hk, D}, dt, 423).to(gpu()),
           gvc = random_cpu({pages, bs, hk, D}, dt, 424).to(gpu());
    Tensor gqw = qw.to(gpu()), gkw = kw.to(gpu());
    const kernels::QkNorm gnorm{&gqw, &gkw, 1e-6f, c.kind};
    kernels::rope_kv_cache_write(gq, gk, gv, pos.to(gpu()), inv.to(gpu()), a, gkc, gvc,
                                 slots.to(gpu()), {}, &gnorm);
    // 16-bit: a last-bit difference in the norm's scale (the sums of squares are added in another
    // order) moves an element by one rounding step. Measured on the H200: 0 to 2.9e-5 (16-bit),
    // 8.9e-8 (F32).
    const double tol = dt == DType::kF32 ? 5e-7 : 1e-4;
    const std::string what =
        std::string(dtype_name(dt)) + " D " + std::to_string(D) + " rot " + std::to_string(c.rot);
    const double eq = rel_err(g, ref), ek = rel_err(gkc, kc);
    std::printf("qk norm + rope %s: rel err qkv %.3g, k cache %.3g\n", what.c_str(), eq, ek);
    EXPECT_LE(eq, tol) << what;
    EXPECT_LE(ek, tol) << what;
    EXPECT_TRUE(same_bytes(gvc, vc)) << what;
  }
}

// FP8 caches: the GPU write rounds exactly as the CPU reference (x / scale, then round to nearest
// even, saturating), from every activation dtype, through the 16-byte path and the element path,
// on values that hit every rounding case: ties, subnormals, saturation.
TEST(GpuKvCacheWrite, Fp8MatchesTheCpuByteForByte) {
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (const kernels::KvScales sc : {kernels::KvScales{}, kernels::KvScales{0.37f, 3.0f}}) {
      for (const int64_t offset : {0, 1}) {  // 1: rows not 16-byte aligned (element path)
        const int64_t pages = 9, bs = 16, hk = 2, D = 64, T = 40, width = hk * D;
        // Rows of 3 * width + 8 elements: 16-byte multiples in every dtype.
        Tensor qkv = random_cpu({T, 3 * width + 8}, DType::kF32, 210, -500, 500);
        // Ties between e4m3 neighbours, subnormals and values past 448, as exact floats.
        const float special[] = {1.0625f,       1.1875f,       15.5f,  -15.5f, 0.0029296875f,
                                 0.0009765625f, 0.0146484375f, 448.0f, 460.0f, 1e6f,
                                 -1e6f,         1e-6f,         -0.0f};
        for (int64_t i = 0; i < T * (3 * width + 8); i += 7)
          qkv.ptr<float>()[i] = special[(i / 7) % std::size(special)] * sc.k;
        Tensor src = tensor_cast_cpu(qkv, dt);
        Tensor k = src.narrow(1, width + offset, width),
               v = src.narrow(1, 2 * width + offset, width);
        Tensor slots = Tensor::empty({T}, DType::kI32);
        for (int64_t t = 0; t < T; ++t)
          slots.ptr<int32_t>()[t] = t % 7 == 3 ? -1 : (t * 11) % (pages * bs);
        Tensor kc = Tensor::zeros({pages, bs, hk, D}, DType::kF8E4M3),
               vc = Tensor::zeros({pages, bs, hk, D}, DType::kF8E4M3);
        Tensor gk = kc.to(gpu()), gv = vc.to(gpu());
        Tensor g = src.to(gpu());
        Tensor gks = g.narrow(1, width + offset, width),
               gvs = g.narrow(1, 2 * width + offset, width);
        kernels::kv_cache_write(kc, vc, k, v, slots, sc);
        kernels::kv_cache_write(gk, gv, gks, gvs, slots.to(gpu()), sc);
        EXPECT_TRUE(same_bytes(gk, kc)) << dtype_name(dt) << " offset " << offset;
        EXPECT_TRUE(same_bytes(gv, vc)) << dtype_name(dt) << " offset " << offset;
      }
    }
  }
}

TEST(GpuRope, FusedWithFp8CacheWriteMatchesTheCpu) {
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const int hq = 8, hk = 2, D = 128, T = 29, pages = 4, bs = 16;
    const int64_t width = (hq + 2 * hk) * D;
    const kernels::KvScales sc{0.5f, 0.25f};
    Tensor qkv = random_cpu({T, width}, dt, 410, -2, 2);
    const auto [pos, slots, inv] = rope_write_inputs(T, D, pages * bs);
    kernels::RopeArgs a{D, D, 1.0f, false};
    Tensor kc = Tensor::zeros({pages, bs, hk, D}, DType::kF8E4M3),
           vc = Tensor::zeros({pages, bs, hk, D}, DType::kF8E4M3);
    Tensor ref = qkv.clone();
    Tensor rq = ref.narrow(1, 0, hq * D), rk = ref.narrow(1, hq * D, hk * D),
           rv = ref.narrow(1, (hq + hk) * D, hk * D);
    kernels::rope_kv_cache_write(rq, rk, rv, pos, inv, a, kc, vc, slots, sc);
    Tensor g = qkv.to(gpu());
    Tensor gq = g.narrow(1, 0, hq * D), gk = g.narrow(1, hq * D, hk * D),
           gv = g.narrow(1, (hq + hk) * D, hk * D);
    Tensor gkc = kc.to(gpu()), gvc = vc.to(gpu());
    poison(gkc);  // every written slot must be overwritten; unwritten ones compared below
    Tensor gvcp = vc.to(gpu());
    poison(gvcp);
    kernels::rope_kv_cache_write(gq, gk, gv, pos.to(gpu()), inv.to(gpu()), a, gkc, gvcp,
                                 slots.to(gpu()), sc);
    EXPECT_LE(rel_err(g, ref), dt == DType::kF32 ? 2e-6 : 2e-3) << dtype_name(dt);
    // Rows the write skipped stay poisoned; rows it wrote match the CPU (k within a code where
    // the two ropes round differently, v exactly).
    Tensor hk8 = host(gkc), hv8 = host(gvcp);
    const int64_t row = static_cast<int64_t>(hk) * D;
    int64_t differing = 0;
    for (int64_t s = 0; s < pages * bs; ++s) {
      bool written = false;
      for (int t = 0; t < T; ++t) written |= slots.ptr<int32_t>()[t] == s;
      for (int64_t i = s * row; i < (s + 1) * row; ++i) {
        const uint8_t gkb = hk8.ptr<uint8_t>()[i], ckb = kc.ptr<uint8_t>()[i];
        if (!written) {
          ASSERT_EQ(gkb, 0xff);
          ASSERT_EQ(hv8.ptr<uint8_t>()[i], 0xff);
          continue;
        }
        ASSERT_EQ(hv8.ptr<uint8_t>()[i], vc.ptr<uint8_t>()[i]) << dtype_name(dt);
        if (gkb != ckb) {
          ++differing;
          ASSERT_EQ(gkb & 0x80, ckb & 0x80);
          ASSERT_LE(std::abs((gkb & 0x7f) - (ckb & 0x7f)), 1) << dtype_name(dt);
        }
      }
    }
    EXPECT_LE(differing, (T - 1) * row / 50) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace atom::test
