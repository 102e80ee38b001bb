// CUDA linear (cuBLASLt and the skinny decode kernel) against the CPU reference.
#include "kernels/linear.h"

#include <cmath>
#include <optional>

#include "gpu_util.h"
#include "kernels/activation.h"
#include "kernels/cuda_tuning.h"
#include "kernels/elementwise.h"
#include "kernels/encoder.h"
#include "kernels/rope.h"

namespace atom::test {
namespace {

struct LinearCase {
  int64_t m, n, k;
  DType in, out;
  bool bias, strided_x;
};

void check_linear(const LinearCase& c, uint64_t seed) {
  const int64_t kx = c.strided_x ? c.k + 24 : c.k;
  Tensor xw = random_cpu({c.m, kx}, c.in, seed, -1, 1);
  Tensor x = xw.narrow(1, c.strided_x ? 16 : 0, c.k);
  Tensor w = random_cpu({c.n, c.k}, c.in, seed + 1, -0.1f, 0.1f);
  Tensor b = c.bias ? random_cpu({c.n}, c.in, seed + 2) : Tensor();
  Tensor ref = Tensor::empty({c.m, c.n}, c.out);
  kernels::linear(ref, x, w, b);
  Tensor gx = xw.to(gpu()).narrow(1, c.strided_x ? 16 : 0, c.k);
  Tensor out = Tensor::empty({c.m, c.n}, c.out, gpu());
  poison(out);
  kernels::linear(out, gx, w.to(gpu()), c.bias ? b.to(gpu()) : Tensor());
  // bf16 outputs: one rounding of a value the CPU rounds too, ~2^-9; fp32 outputs of bf16
  // inputs: summation order only.
  const double tol = c.out == DType::kF32 ? (c.in == DType::kF32 ? 1e-5 : 2e-5) : 5e-3;
  EXPECT_LE(rel_err(out, ref), tol)
      << "M=" << c.m << " N=" << c.n << " K=" << c.k << " " << dtype_name(c.in) << "->"
      << dtype_name(c.out) << (c.bias ? " bias" : "") << (c.strided_x ? " strided" : "")
      << " skinny<=" << kernels::cuda::cuda_tuning().skinny_max_m;
}

// This thread's tuning with skinny_max_m = m, for a CudaTuningScope.
kernels::cuda::CudaTuning skinny_max_m(int m) {
  return kernels::cuda::cuda_tuning_with([&](kernels::cuda::CudaTuning& t) { t.skinny_max_m = m; });
}

const LinearCase kCases[] = {
    {1, 4096, 4096, DType::kBF16, DType::kBF16, false, false},
    {1, 1000, 512, DType::kBF16, DType::kF32, false, false},
    {2, 6144, 4096, DType::kBF16, DType::kBF16, true, true},
    {3, 130, 200, DType::kBF16, DType::kBF16, true, false},
    {4, 256, 1024, DType::kF16, DType::kF16, false, true},
    {5, 96, 72, DType::kBF16, DType::kBF16, true, false},
    {17, 1000, 4096, DType::kBF16, DType::kF32, false, false},
    {128, 14336, 512, DType::kBF16, DType::kBF16, false, true},
    {300, 384, 256, DType::kBF16, DType::kBF16, true, false},
    {33, 64, 100, DType::kF32, DType::kF32, true, false},
    {1, 4096, 14336, DType::kBF16, DType::kBF16, false, false},
    {3, 1001, 2056, DType::kBF16, DType::kBF16, true, true},
    {1, 130, 1032, DType::kF16, DType::kF32, false, false},
};

TEST(GpuLinear, SkinnyAndCublasLtMatchCpu) {
  uint64_t seed = 300;
  // Skinny with K split over a block's warps (every N here is below 1 << 20), unsplit, cuBLASLt.
  for (auto [skinny, split] : {std::pair{4, int64_t{1} << 20}, {4, int64_t{0}}, {0, int64_t{0}}}) {
    const kernels::cuda::CudaTuningScope scope(
        kernels::cuda::cuda_tuning_with([&](kernels::cuda::CudaTuning& t) {
          t.skinny_max_m = skinny;
          t.skinny_split_max_n = split;
        }));
    SCOPED_TRACE("split below N " + std::to_string(split));
    for (const LinearCase& c : kCases) check_linear(c, seed += 3);
  }
}

// gate_up and SiLU·mul in one skinny kernel: byte-identical to linear() then silu_mul() on the
// GPU (same products, same roundings), close to the CPU; not applied (false) past the skinny M.
TEST(GpuLinear, SiluMulFusedMatchesLinearThenSiluMul) {
  std::optional<kernels::cuda::CudaTuningScope> tuning;
  tuning.emplace(skinny_max_m(4));
  struct Case {
    int64_t m, i, k;
    DType dt;
    bool bias, strided_x;
  };
  uint64_t seed = 700;
  for (const Case& c : {Case{1, 14336, 4096, DType::kBF16, false, false},
                        Case{2, 1000, 2056, DType::kBF16, true, true},  // K split over warps
                        Case{4, 130, 520, DType::kF16, true, false},
                        Case{3, 4096, 1024, DType::kBF16, false, true}}) {
    SCOPED_TRACE("M=" + std::to_string(c.m) + " I=" + std::to_string(c.i));
    const int64_t kx = c.strided_x ? c.k + 24 : c.k;
    Tensor xw = random_cpu({c.m, kx}, c.dt, ++seed, -1, 1);
    Tensor w = random_cpu({2 * c.i, c.k}, c.dt, ++seed, -0.1f, 0.1f);
    Tensor b = c.bias ? random_cpu({2 * c.i}, c.dt, ++seed) : Tensor();
    Tensor gx = xw.to(gpu()).narrow(1, c.strided_x ? 16 : 0, c.k);
    Tensor gw = w.to(gpu()), gb = c.bias ? b.to(gpu()) : Tensor();
    Tensor fused = Tensor::empty({c.m, c.i}, c.dt, gpu());
    poison(fused);
    ASSERT_TRUE(kernels::linear_silu_mul(fused, gx, gw, gb));
    Tensor gate_up = Tensor::empty({c.m, 2 * c.i}, c.dt, gpu());
    Tensor two = Tensor::empty({c.m, c.i}, c.dt, gpu());
    kernels::linear(gate_up, gx, gw, gb);
    kernels::silu_mul(two, gate_up);
    EXPECT_TRUE(same_bytes(fused, two));
    Tensor ref_gu = Tensor::empty({c.m, 2 * c.i}, c.dt), ref = Tensor::empty({c.m, c.i}, c.dt);
    kernels::linear(ref_gu, xw.narrow(1, c.strided_x ? 16 : 0, c.k), w, b);
    kernels::silu_mul(ref, ref_gu);
    EXPECT_LE(rel_err(fused, ref), 1e-2);
  }
  Tensor x5 = Tensor::empty({5, 64}, DType::kBF16, gpu()),
         w = Tensor::empty({64, 64}, DType::kBF16, gpu());
  Tensor o5 = Tensor::empty({5, 32}, DType::kBF16, gpu());
  EXPECT_FALSE(kernels::linear_silu_mul(o5, x5, w));
  Tensor cx = Tensor::empty({1, 64}, DType::kBF16), cw = Tensor::empty({64, 64}, DType::kBF16);
  Tensor co = Tensor::empty({1, 32}, DType::kBF16);
  EXPECT_FALSE(kernels::linear_silu_mul(co, cx, cw));
}

// cuBLASLt's GELU and accumulating (beta = 1) epilogues: close to linear() then gelu() / add() on
// the GPU and on the CPU (the CPU's F32 product, GELU and add rounded to BF16 once each); not
// applied (false) at decode-sized M or on the CPU. MoonViT's shapes (fc0 1152 -> 4304, wo and
// fc1 back into the residual) and odd ones, with and without a bias, strided rows.
TEST(GpuLinear, GeluAndAccumulateEpiloguesMatchTheOpsApart) {
  struct Case {
    int64_t m, n, k;
    DType dt;
    bool bias, strided_x;
    float wr = 0.1f;  // weights in [-wr, wr]
  };
  uint64_t seed = 900;
  // F32 (no output rounding; products of magnitude ~2, where GELU's erf and tanh forms differ by
  // up to 4.7e-4): shows that the epilogue computes the tanh form.
  for (const Case& c :
       {Case{1024, 4304, 1152, DType::kBF16, true, false},
        Case{300, 1152, 4304, DType::kBF16, true, true},
        Case{77, 200, 96, DType::kBF16, false, false}, Case{129, 136, 72, DType::kF16, true, true},
        Case{100, 256, 128, DType::kF32, true, false, 0.5f}}) {
    SCOPED_TRACE("M=" + std::to_string(c.m) + " N=" + std::to_string(c.n) +
                 " K=" + std::to_string(c.k));
    const int64_t kx = c.strided_x ? c.k + 24 : c.k;
    Tensor xw = random_cpu({c.m, kx}, c.dt, ++seed, -1, 1);
    Tensor x = xw.narrow(1, c.strided_x ? 16 : 0, c.k);
    Tensor w = random_cpu({c.n, c.k}, c.dt, ++seed, -c.wr, c.wr);
    Tensor b = c.bias ? random_cpu({c.n}, c.dt, ++seed, -1, 1) : Tensor();
    Tensor r0 = random_cpu({c.m, c.n}, c.dt, ++seed, -2, 2);  // the residual
    Tensor gx = xw.to(gpu()).narrow(1, c.strided_x ? 16 : 0, c.k);
    Tensor gw = w.to(gpu()), gb = c.bias ? b.to(gpu()) : Tensor();
    // CPU: F32 product, then the ops.
    Tensor y = Tensor::empty({c.m, c.n}, DType::kF32), yx = Tensor::empty({c.m, c.n}, DType::kF32);
    Tensor x32 = Tensor::empty(x.shape(), DType::kF32), w32 = Tensor::empty(w.shape(), DType::kF32);
    kernels::cast(x32, x);
    kernels::cast(w32, w);
    Tensor b32;
    if (c.bias) {
      b32 = Tensor::empty({c.n}, DType::kF32);
      Tensor rows = b32.view({1, c.n});
      kernels::cast(rows, b.view({1, c.n}));
    }
    kernels::linear(y, x32, w32, b32);
    Tensor ref_gelu = Tensor::empty({c.m, c.n}, DType::kF32);
    kernels::gelu(ref_gelu, y, /*tanh_approx=*/true);
    Tensor ref_acc = Tensor::empty({c.m, c.n}, DType::kF32);
    kernels::cast(yx, r0);
    kernels::add(ref_acc, yx, y);
    // GPU, fused.
    Tensor g = Tensor::empty({c.m, c.n}, c.dt, gpu());
    poison(g);
    ASSERT_TRUE(kernels::linear_gelu(g, gx, gw, gb));
    Tensor acc = r0.to(gpu());
    ASSERT_TRUE(kernels::linear_accumulate(acc, gx, gw, gb));
    // GPU, apart.
    Tensor g2 = Tensor::empty({c.m, c.n}, c.dt, gpu()), p = Tensor::empty({c.m, c.n}, c.dt, gpu());
    kernels::linear(g2, gx, gw, gb);
    kernels::gelu(g2, g2, /*tanh_approx=*/true);
    Tensor acc2 = r0.to(gpu());
    kernels::linear(p, gx, gw, gb);
    kernels::add(acc2, acc2, p);
    const double eg = rel_err(g, ref_gelu), eg2 = rel_err(g2, ref_gelu);
    const double ea = rel_err(acc, ref_acc), ea2 = rel_err(acc2, ref_acc);
    std::printf(
        "M=%lld N=%lld K=%lld: gelu fused %.3g apart %.3g; accumulate fused %.3g apart %.3g\n",
        static_cast<long long>(c.m), static_cast<long long>(c.n), static_cast<long long>(c.k), eg,
        eg2, ea, ea2);
    // One BF16 rounding of the output (2^-9 relative, ~2e-3 as an L2 ratio) and, apart, one more
    // of the product before the op.
    const double tol = c.dt == DType::kF32 ? 1e-5 : 4e-3;  // measured F32 1.3e-6
    EXPECT_LE(eg, tol);
    EXPECT_LE(ea, tol);
    EXPECT_LE(rel_err(g, g2), 6e-3);
    EXPECT_LE(rel_err(acc, acc2), 6e-3);
  }
  const kernels::cuda::CudaTuningScope scope(skinny_max_m(4));
  Tensor x2 = Tensor::empty({2, 64}, DType::kBF16, gpu()),
         w = Tensor::empty({64, 64}, DType::kBF16, gpu());
  Tensor o2 = Tensor::empty({2, 64}, DType::kBF16, gpu());
  EXPECT_FALSE(kernels::linear_gelu(o2, x2, w));
  EXPECT_FALSE(kernels::linear_accumulate(o2, x2, w));
  Tensor cx = Tensor::empty({8, 64}, DType::kBF16), cw = Tensor::empty({64, 64}, DType::kBF16);
  Tensor co = Tensor::empty({8, 64}, DType::kBF16);
  EXPECT_FALSE(kernels::linear_gelu(co, cx, cw));
  EXPECT_FALSE(kernels::linear_accumulate(co, cx, cw));
}

// The [q; k; v] projection with RoPE and the cache write in its epilogue: byte-identical to
// linear() then rope_kv_cache_write() on the GPU (output rows, both caches, a skipped slot),
// close to the CPU; not applied (false) where the fused kernel does not cover the case.
TEST(GpuLinear, RopeKvFusedMatchesLinearThenRope) {
  std::optional<kernels::cuda::CudaTuningScope> tuning;
  tuning.emplace(skinny_max_m(4));
  struct Case {
    int64_t m;
    int hq, hk, d;
    int64_t k;
    DType dt;
    bool bias;
  };
  uint64_t seed = 800;
  for (const Case& c :
       {Case{1, 32, 8, 128, 4096, DType::kBF16, false}, Case{3, 8, 2, 64, 520, DType::kBF16, true},
        Case{4, 4, 4, 128, 1032, DType::kF16, true}}) {
    SCOPED_TRACE("M=" + std::to_string(c.m) + " D=" + std::to_string(c.d));
    const int64_t n = static_cast<int64_t>(c.hq + 2 * c.hk) * c.d, pages = 3, bs = 4;
    Tensor x = random_cpu({c.m, c.k}, c.dt, ++seed, -1, 1);
    Tensor w = random_cpu({n, c.k}, c.dt, ++seed, -0.1f, 0.1f);
    Tensor b = c.bias ? random_cpu({n}, c.dt, ++seed) : Tensor();
    Tensor kc0 = random_cpu({pages, bs, c.hk, c.d}, c.dt, ++seed);
    Tensor vc0 = random_cpu({pages, bs, c.hk, c.d}, c.dt, ++seed);
    Tensor pos = Tensor::empty({c.m}, DType::kI32), slots = Tensor::empty({c.m}, DType::kI32);
    for (int64_t t = 0; t < c.m; ++t) {
      pos.ptr<int32_t>()[t] = static_cast<int32_t>(1000 + 37 * t);
      slots.ptr<int32_t>()[t] = t == 1 ? -1 : static_cast<int32_t>((t * 5 + 2) % (pages * bs));
    }
    Tensor inv = Tensor::empty({c.d / 2}, DType::kF32);
    for (int i = 0; i < c.d / 2; ++i)
      inv.ptr<float>()[i] = 1.0f / std::pow(500000.0f, 2.0f * i / static_cast<float>(c.d));
    Tensor gx = x.to(gpu()), gw = w.to(gpu()), gb = c.bias ? b.to(gpu()) : Tensor();
    Tensor gpos = pos.to(gpu()), gslots = slots.to(gpu()), ginv = inv.to(gpu());
    const float scale = 1.1f;
    // Fused.
    Tensor fk = kc0.to(gpu()), fv = vc0.to(gpu());
    Tensor fused = Tensor::empty({c.m, n}, c.dt, gpu());
    poison(fused);
    kernels::QkvRope r;
    r.q_heads = c.hq;
    r.kv_heads = c.hk;
    r.head_dim = c.d;
    r.positions = &gpos;
    r.inv_freq = &ginv;
    r.scale = scale;
    r.rot_dim = c.d;
    r.k_cache = &fk;
    r.v_cache = &fv;
    r.slot_mapping = &gslots;
    ASSERT_TRUE(kernels::linear_rope_kv(fused, gx, gw, gb, r));
    // Two ops on the GPU, and on the CPU.
    const int64_t qw = static_cast<int64_t>(c.hq) * c.d, kw = static_cast<int64_t>(c.hk) * c.d;
    const kernels::RopeArgs ra{c.d, c.d, scale, false};
    Tensor tk = kc0.to(gpu()), tv = vc0.to(gpu());
    Tensor two = Tensor::empty({c.m, n}, c.dt, gpu());
    kernels::linear(two, gx, gw, gb);
    Tensor q2 = two.narrow(1, 0, qw), k2 = two.narrow(1, qw, kw), v2 = two.narrow(1, qw + kw, kw);
    kernels::rope_kv_cache_write(q2, k2, v2, gpos, ginv, ra, tk, tv, gslots);
    EXPECT_TRUE(same_bytes(fused, two));
    EXPECT_TRUE(same_bytes(fk, tk));
    EXPECT_TRUE(same_bytes(fv, tv));
    Tensor ck = kc0.clone(), cv = vc0.clone(), cpu_out = Tensor::empty({c.m, n}, c.dt);
    kernels::linear(cpu_out, x, w, b);
    Tensor q3 = cpu_out.narrow(1, 0, qw), k3 = cpu_out.narrow(1, qw, kw),
           v3 = cpu_out.narrow(1, qw + kw, kw);
    kernels::rope_kv_cache_write(q3, k3, v3, pos, inv, ra, ck, cv, slots);
    EXPECT_LE(rel_err(fused, cpu_out), 1e-2);
    EXPECT_LE(rel_err(fk, ck), 1e-2);
    // Not covered: interleaved or partial rotation, an FP8 cache, more rows than the skinny M.
    kernels::QkvRope other = r;
    other.interleaved = true;
    EXPECT_FALSE(kernels::linear_rope_kv(fused, gx, gw, gb, other));
    other = r;
    other.rot_dim = c.d / 2;
    EXPECT_FALSE(kernels::linear_rope_kv(fused, gx, gw, gb, other));
    Tensor k8 = Tensor::empty({pages, bs, c.hk, c.d}, DType::kF8E4M3, gpu());
    Tensor v8 = Tensor::empty({pages, bs, c.hk, c.d}, DType::kF8E4M3, gpu());
    other = r;
    other.k_cache = &k8;
    other.v_cache = &v8;
    EXPECT_FALSE(kernels::linear_rope_kv(fused, gx, gw, gb, other));
  }
  tuning.emplace(skinny_max_m(0));
  Tensor x1 = Tensor::empty({1, 64}, DType::kBF16, gpu());
  Tensor w1 = Tensor::empty({3 * 64, 64}, DType::kBF16, gpu());
  Tensor o1 = Tensor::empty({1, 3 * 64}, DType::kBF16, gpu());
  Tensor p1 = Tensor::empty({1}, DType::kI32, gpu()), i1 = Tensor::empty({32}, DType::kF32, gpu());
  Tensor kc = Tensor::empty({2, 64}, DType::kBF16, gpu()),
         vc = Tensor::empty({2, 64}, DType::kBF16, gpu());
  kernels::QkvRope r1;
  r1.q_heads = r1.kv_heads = 1;
  r1.head_dim = r1.rot_dim = 64;
  r1.positions = &p1;
  r1.inv_freq = &i1;
  r1.k_cache = &kc;
  r1.v_cache = &vc;
  r1.slot_mapping = &p1;
  EXPECT_FALSE(kernels::linear_rope_kv(o1, x1, w1, Tensor(), r1));  // skinny off: cuBLASLt path
}

// The after-attention hint (a quarter of the first weight loads before the PDL wait) changes
// when the skinny kernel loads, not what it computes: the same bytes, split over the warps or not.
TEST(GpuLinear, SkinnyAfterLatencyBoundHintSameBytes) {
  std::optional<kernels::cuda::CudaTuningScope> tuning;
  tuning.emplace(skinny_max_m(2));
  uint64_t seed = 1300;
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 4096, 4096},
                                {2, 1000, 4096},
                                {1, 300, 520},
                                {2, 64, 8200}}) {
    SCOPED_TRACE("M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k));
    Tensor x = random_cpu({m, k}, DType::kBF16, ++seed, -1, 1).to(gpu());
    Tensor w = random_cpu({n, k}, DType::kBF16, ++seed, -0.1f, 0.1f).to(gpu());
    Tensor plain = Tensor::empty({m, n}, DType::kBF16, gpu());
    Tensor hinted = Tensor::empty({m, n}, DType::kBF16, gpu());
    poison(plain);
    poison(hinted);
    kernels::linear(plain, x, w);
    kernels::linear(hinted, x, w, Tensor(), {.after_latency_bound = true});
    EXPECT_TRUE(same_bytes(plain, hinted));
    Tensor cpu_out = Tensor::empty({m, n}, DType::kBF16);
    kernels::linear(cpu_out, x.to(Device::cpu()), w.to(Device::cpu()));
    EXPECT_LE(rel_err(hinted, cpu_out), 1e-2);
  }
}

TEST(GpuLinear, SamePlanReusedAcrossPointers) {
  // Cached plans must not bake in a pointer: run one shape on two different buffers.
  for (int i = 0; i < 2; ++i)
    check_linear({64, 512, 256, DType::kBF16, DType::kBF16, true, false}, 900 + i);
}

}  // namespace
}  // namespace atom::test
