// CUDA element-wise kernels against the CPU reference.
#include "kernels/elementwise.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "gpu_util.h"
#include "kernels/activation.h"
#include "kernels/embedding.h"
#include "kernels/random.h"

namespace atom::test {
namespace {

TEST(GpuElementwise, FillUniformMatchesCpuExactly) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3}) {
    // e4m3: the range --load-format dummy draws FP8 weights from (every exponent, no saturation).
    const float lo = dt == DType::kF8E4M3 ? -224.0f : -0.5f,
                hi = dt == DType::kF8E4M3 ? 224.0f : 2.0f;
    Tensor c = Tensor::empty({1001, 37}, dt);
    kernels::fill_uniform(c, 1234, lo, hi);
    Tensor g = Tensor::empty({1001, 37}, dt, gpu());
    poison(g);
    kernels::fill_uniform(g, 1234, lo, hi);
    EXPECT_TRUE(same_bytes(g, c)) << dtype_name(dt);
  }
}

// The random bytes --load-format dummy fills MXFP4 blocks and scales with: the CPU's bytes, every
// value of [lo, hi] drawn and none outside it.
TEST(GpuElementwise, FillUniformBytesMatchesCpuExactly) {
  for (auto [lo, hi] : {std::pair{0, 255}, std::pair{118, 120}}) {
    Tensor c = Tensor::empty({1001, 37}, DType::kU8);
    kernels::fill_uniform_bytes(c, 99, lo, hi);
    Tensor g = Tensor::empty({1001, 37}, DType::kU8, gpu());
    poison(g);
    kernels::fill_uniform_bytes(g, 99, lo, hi);
    EXPECT_TRUE(same_bytes(g, c)) << lo << ".." << hi;
    std::vector<int> seen(256, 0);
    for (int64_t i = 0; i < c.numel(); ++i) ++seen[static_cast<const uint8_t*>(c.data())[i]];
    for (int v = 0; v < 256; ++v) EXPECT_EQ(seen[v] > 0, v >= lo && v <= hi) << v;
  }
}

TEST(GpuElementwise, AddCastBiasOnStridedRows) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    // a and b are column slices of wider tensors: strided rows.
    Tensor wa = random_cpu({33, 300}, dt, 1), wb = random_cpu({33, 200}, dt, 2);
    Tensor a = wa.narrow(1, 100, 150), b = wb.narrow(1, 7, 150);
    Tensor ref = Tensor::empty({33, 150}, dt);
    kernels::add(ref, a, b);
    Tensor ga = wa.to(gpu()).narrow(1, 100, 150), gb = wb.to(gpu()).narrow(1, 7, 150);
    Tensor out = Tensor::empty({33, 150}, dt, gpu());
    poison(out);
    kernels::add(out, ga, gb);
    EXPECT_LE(rel_err(out, ref), 1e-6) << dtype_name(dt);

    Tensor bias = random_cpu({150}, dt, 3);
    Tensor ref2 = ref.clone();
    kernels::add_bias(ref2, bias);
    kernels::add_bias(out, bias.to(gpu()));
    EXPECT_LE(rel_err(out, ref2), 1e-6) << dtype_name(dt);
  }
  Tensor x = random_cpu({17, 129}, DType::kF32, 4, -100, 100);
  for (DType to : {DType::kBF16, DType::kF16, DType::kF32}) {
    Tensor ref = Tensor::empty({17, 129}, to);
    kernels::cast(ref, x);
    Tensor out = Tensor::empty({17, 129}, to, gpu());
    poison(out);
    kernels::cast(out, x.to(gpu()));
    EXPECT_TRUE(same_bytes(out, ref)) << dtype_name(to);
  }
}

TEST(GpuElementwise, AddGatedMatchesCpu) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor a = random_cpu({37, 130}, dt, 1), b = random_cpu({37, 130}, dt, 2);
    Tensor g = random_cpu({37, 1}, dt, 3, -4, 4);
    Tensor ref = Tensor::empty({37, 130}, dt);
    kernels::add_gated(ref, a, b, g);
    Tensor out = Tensor::empty({37, 130}, dt, gpu());
    poison(out);
    kernels::add_gated(out, a.to(gpu()), b.to(gpu()), g.to(gpu()));
    EXPECT_LE(rel_err(out, ref), 1e-6) << dtype_name(dt);
  }
}

TEST(GpuElementwise, GatherRowsAndEmbeddingShards) {
  Tensor x = random_cpu({50, 96}, DType::kBF16, 5);
  std::vector<int32_t> idx = {49, 0, 7, 7, 23};
  Tensor ci = Tensor::empty({5}, DType::kI32);
  std::memcpy(ci.data(), idx.data(), 20);
  Tensor ref = Tensor::empty({5, 96}, DType::kBF16);
  kernels::gather_rows(ref, x, ci);
  Tensor out = Tensor::empty({5, 96}, DType::kBF16, gpu());
  poison(out);
  Tensor gi = ci.to(gpu());
  kernels::gather_rows(out, x.to(gpu()), gi);
  EXPECT_TRUE(same_bytes(out, ref));

  // A vocabulary shard [100, 164): ids outside it give zero rows.
  Tensor table = random_cpu({64, 72}, DType::kBF16, 6);
  std::vector<int32_t> ids = {100, 163, 164, 5, 120, 99, 130};
  Tensor cids = Tensor::empty({7}, DType::kI32);
  std::memcpy(cids.data(), ids.data(), ids.size() * 4);
  for (DType od : {DType::kBF16, DType::kF32}) {
    Tensor eref = Tensor::empty({7, 72}, od);
    kernels::embedding(eref, cids, table, 100);
    Tensor eout = Tensor::empty({7, 72}, od, gpu());
    poison(eout);
    Tensor gids = cids.to(gpu());
    kernels::embedding(eout, gids, table.to(gpu()), 100);
    EXPECT_TRUE(same_bytes(eout, eref)) << dtype_name(od);
  }
  // Rows of 1,025 16-byte words: more than one word per thread on the vector path.
  Tensor wide = random_cpu({8, 8200}, DType::kBF16, 7);
  std::vector<int32_t> wids = {3, 0, 7, 9};
  Tensor cw = Tensor::empty({4}, DType::kI32);
  std::memcpy(cw.data(), wids.data(), 16);
  Tensor wref = Tensor::empty({4, 8200}, DType::kBF16);
  kernels::embedding(wref, cw, wide, 0);
  Tensor wout = Tensor::empty({4, 8200}, DType::kBF16, gpu());
  poison(wout);
  Tensor gw = cw.to(gpu());
  kernels::embedding(wout, gw, wide.to(gpu()), 0);
  EXPECT_TRUE(same_bytes(wout, wref));
}

TEST(GpuElementwise, SiluMulVectorAndScalarPaths) {
  struct Case {
    int64_t m, i;
    DType dt;
  };
  for (const Case& c :
       {Case{7, 14336, DType::kBF16}, Case{3, 1000, DType::kBF16}, Case{5, 37, DType::kBF16},
        Case{4, 256, DType::kF16}, Case{9, 100, DType::kF32}}) {
    Tensor x = random_cpu({c.m, 2 * c.i}, c.dt, 7, -6, 6);
    Tensor ref = Tensor::empty({c.m, c.i}, c.dt);
    kernels::silu_mul(ref, x);
    Tensor out = Tensor::empty({c.m, c.i}, c.dt, gpu());
    poison(out);
    kernels::silu_mul(out, x.to(gpu()));
    // Same formula in fp32 on both sides; at most a rounding flip of the low-precision output.
    EXPECT_LE(rel_err(out, ref), c.dt == DType::kF32 ? 1e-6 : 1e-3) << c.m << "x" << c.i;
  }
}

// The clamped SwiGLU (swiglu_limit: DeepSeek-V4's and GLM-5.3's dense MLPs) on both kernel paths
// against the CPU; inputs in [-6, 6] with limit 3, so about half the gates and up values clamp
// (the unclamped product differs from the reference by far more than the bound).
TEST(GpuElementwise, ClampedSiluMulMatchesCpu) {
  struct Case {
    int64_t m, i;
    DType dt;
  };
  for (const Case& c : {Case{7, 2048, DType::kBF16}, Case{5, 37, DType::kBF16},
                        Case{4, 256, DType::kF16}, Case{9, 100, DType::kF32}}) {
    Tensor x = random_cpu({c.m, 2 * c.i}, c.dt, 8, -6, 6);
    Tensor ref = Tensor::empty({c.m, c.i}, c.dt), plain = Tensor::empty({c.m, c.i}, c.dt);
    kernels::silu_mul(ref, x, 3.0f);
    kernels::silu_mul(plain, x);
    Tensor out = Tensor::empty({c.m, c.i}, c.dt, gpu());
    poison(out);
    kernels::silu_mul(out, x.to(gpu()), 3.0f);
    const double e = rel_err(out, ref), unclamped = rel_err(plain, ref);
    EXPECT_LE(e, c.dt == DType::kF32 ? 1e-6 : 1e-3) << c.m << "x" << c.i;
    EXPECT_GT(unclamped, 0.1) << "the limit should matter on these inputs";
    std::printf("clamped silu_mul %ldx%ld %s: rel err %.3g (unclamped would be %.3g)\n",
                static_cast<long>(c.m), static_cast<long>(c.i),
                std::string(dtype_name(c.dt)).c_str(), e, unclamped);
  }
}

// Kimi-K3's SiTU (beta 1.5, linear_beta 2 and none) on both kernel paths against the CPU; inputs in
// [-6, 6], so both soft caps bend most values (plain SiLU · up differs by far more than the bound).
TEST(GpuElementwise, SituMatchesCpu) {
  struct Case {
    int64_t m, i;
    DType dt;
  };
  for (const float lb : {2.0f, 0.0f})
    for (const Case& c : {Case{7, 2048, DType::kBF16}, Case{5, 37, DType::kBF16},
                          Case{4, 256, DType::kF16}, Case{9, 100, DType::kF32}}) {
      const kernels::Glu situ = kernels::Glu::situ(1.5f, lb);
      Tensor x = random_cpu({c.m, 2 * c.i}, c.dt, 9, -6, 6);
      Tensor ref = Tensor::empty({c.m, c.i}, c.dt), plain = Tensor::empty({c.m, c.i}, c.dt);
      kernels::glu(ref, x, situ);
      kernels::silu_mul(plain, x);
      Tensor out = Tensor::empty({c.m, c.i}, c.dt, gpu());
      poison(out);
      kernels::glu(out, x.to(gpu()), situ);
      const double e = rel_err(out, ref), silu = rel_err(plain, ref);
      EXPECT_LE(e, c.dt == DType::kF32 ? 1e-6 : 1e-3) << c.m << "x" << c.i;
      EXPECT_GT(silu, 0.1) << "SiTU should differ from SiLU on these inputs";
      std::printf("situ lb=%g %ldx%ld %s: rel err %.3g (SiLU would be %.3g)\n", lb,
                  static_cast<long>(c.m), static_cast<long>(c.i),
                  std::string(dtype_name(c.dt)).c_str(), e, silu);
    }
}

}  // namespace
}  // namespace atom::test
