// CUDA hyper-connection kernels (kernels/hyper_connection.h) against the CPU reference: a mix
// site's collapsed input, post weights and Sinkhorn'd comb matrix, the write-back into the
// streams, the final head by learned weights and by the mean, and the expansion of the
// embedding; at GLM-5.3's four streams (the compiled-in count) and at others (the generic
// kernel), F32 and BF16 sublayer tensors; DeepSeek-V4.1's single-pass form and Engram gate.
#include <cstdio>

#include "common/test_util.h"
#include "gpu_util.h"
#include "kernels/attn_res.h"
#include "kernels/engram.h"
#include "kernels/hyper_connection.h"

namespace atom::test {
namespace {

struct HcCase {
  int64_t tokens, dim;
  int hc, iters;
  DType act;
};

// F32 math on both sides in other orders (the GPU's dot products in float, the CPU's in
// double); a BF16 output rounds once (2^-9 relative).
double out_tol_of(DType act) { return act == DType::kF32 ? 1e-5 : 4e-3; }

void run_hc_case(const HcCase& c, uint64_t seed) {
  const int64_t T = c.tokens, D = c.dim, hc = c.hc, rows = (2 + hc) * hc;
  kernels::HcArgs a;
  a.hc = c.hc;
  a.sinkhorn_iters = c.iters;
  a.hc_eps = 1e-6f;
  a.norm_eps = 1e-6f;
  Tensor x = random_cpu({T, hc, D}, DType::kF32, seed, -2, 2);
  // fn small enough that the sigmoids and the softmax are not saturated.
  Tensor fn = random_cpu({rows, hc * D}, DType::kF32, seed + 1, -0.05f, 0.05f);
  Tensor base = random_cpu({rows}, DType::kF32, seed + 2, -1, 1);
  Tensor scale = random_cpu({3}, DType::kF32, seed + 3, 0.5f, 2);
  Tensor y = random_cpu({T, D}, c.act, seed + 4, -1, 1);
  const Tensor gx = x.to(gpu()), gfn = fn.to(gpu()), gbase = base.to(gpu()),
               gscale = scale.to(gpu());
  const std::string what = "hc " + std::to_string(hc) + " D " + std::to_string(D) + " T " +
                           std::to_string(T) + " " + std::string(dtype_name(c.act));

  // The mix.
  Tensor in = Tensor::empty({T, D}, c.act), post = Tensor::empty({T, hc}, DType::kF32),
         comb = Tensor::empty({T, hc, hc}, DType::kF32);
  kernels::hc_mix(in, post, comb, x, fn, base, scale, a);
  Tensor gin = Tensor::empty({T, D}, c.act, gpu()),
         gpost = Tensor::empty({T, hc}, DType::kF32, gpu()),
         gcomb = Tensor::empty({T, hc, hc}, DType::kF32, gpu());
  poison(gin);
  poison(gpost);
  poison(gcomb);
  kernels::hc_mix(gin, gpost, gcomb, gx, gfn, gbase, gscale, a);
  const double e_post = rel_err(host(gpost), post), e_comb = rel_err(host(gcomb), comb),
               e_in = rel_err(host(gin), in);
  // The comb matrices are (nearly) doubly stochastic after Sinkhorn: a check of the reference.
  const Tensor cb = host(gcomb);
  double worst_col = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < hc; ++j) {
      double s = 0;
      for (int64_t i = 0; i < hc; ++i) s += cb.ptr<float>()[(t * hc + i) * hc + j];
      worst_col = std::max(worst_col, std::fabs(s - 1.0));
    }

  // The write-back, from the CPU's mix on both sides.
  Tensor x2 = x.clone();
  kernels::hc_write_back(x2, y, post, comb);
  Tensor gx2 = gx.clone();
  kernels::hc_write_back(gx2, y.to(gpu()), post.to(gpu()), comb.to(gpu()));
  const double e_wb = rel_err(host(gx2), x2);

  // The heads: learned weights (fn [hc, hc D]) and the mean.
  Tensor hfn = fn.narrow(0, 0, hc).contiguous(), hbase = base.narrow(0, 0, hc).contiguous(),
         hscale = scale.narrow(0, 0, 1).contiguous();
  Tensor head = Tensor::empty({T, D}, c.act), mean = Tensor::empty({T, D}, c.act);
  kernels::hc_head(head, x, hfn, hbase, hscale, a);
  kernels::hc_head(mean, x, Tensor(), Tensor(), Tensor(), a);
  Tensor ghead = Tensor::empty({T, D}, c.act, gpu()), gmean = Tensor::empty({T, D}, c.act, gpu());
  poison(ghead);
  poison(gmean);
  kernels::hc_head(ghead, gx, hfn.to(gpu()), hbase.to(gpu()), hscale.to(gpu()), a);
  kernels::hc_head(gmean, gx, Tensor(), Tensor(), Tensor(), a);
  const double e_head = rel_err(host(ghead), head), e_mean = rel_err(host(gmean), mean);

  // DeepSeek-V4.1's single-pass form: the site's pre out (which must be the weights hc_head
  // computes from the first hc rows) and the input collapsed by a carried pre; the last collapse.
  Tensor carried = random_cpu({T, hc}, DType::kF32, seed + 5, 0, 1);
  Tensor cin = Tensor::empty({T, D}, c.act), cpost = Tensor::empty({T, hc}, DType::kF32),
         ccomb = Tensor::empty({T, hc, hc}, DType::kF32),
         cpre = Tensor::empty({T, hc}, DType::kF32);
  kernels::hc_mix(cin, cpost, ccomb, x, fn, base, scale, a, {&carried, &cpre});
  Tensor gcin = Tensor::empty({T, D}, c.act, gpu()),
         gcpost = Tensor::empty({T, hc}, DType::kF32, gpu()),
         gccomb = Tensor::empty({T, hc, hc}, DType::kF32, gpu()),
         gcpre = Tensor::empty({T, hc}, DType::kF32, gpu()), gcarried = carried.to(gpu());
  poison(gcin);
  poison(gcpre);
  kernels::hc_mix(gcin, gcpost, gccomb, gx, gfn, gbase, gscale, a, {&gcarried, &gcpre});
  Tensor by_carried = Tensor::empty({T, D}, c.act), gby = Tensor::empty({T, D}, c.act, gpu());
  kernels::hc_collapse(by_carried, x, carried);
  poison(gby);
  kernels::hc_collapse(gby, gx, gcarried);
  // The CPU's pre against the sigmoid of the same mixes written here (double sums).
  double e_pre_rule = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x.ptr<float>() + t * hc * D;
    double ss = 0;
    for (int64_t i = 0; i < hc * D; ++i) ss += static_cast<double>(xt[i]) * xt[i];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(hc * D) + a.norm_eps);
    for (int64_t j = 0; j < hc; ++j) {
      double m = 0;
      for (int64_t i = 0; i < hc * D; ++i) m += xt[i] * r * fn.ptr<float>()[j * hc * D + i];
      const double want =
          1.0 / (1.0 + std::exp(-(m * scale.ptr<float>()[0] + base.ptr<float>()[j]))) + a.hc_eps;
      e_pre_rule = std::max(e_pre_rule, std::fabs(cpre.ptr<float>()[t * hc + j] - want));
    }
  }
  const double e_cpre = rel_err(host(gcpre), cpre), e_cin = rel_err(host(gcin), cin),
               e_cin_rule = rel_err(cin, by_carried), e_by = rel_err(host(gby), by_carried),
               e_cpost = rel_err(host(gcpost), post);
  std::printf("  %s single pass: pre %.3g (rule %.3g) input %.3g (= collapse by the carried pre "
              "%.3g) collapse %.3g post %.3g\n",
              what.c_str(), e_cpre, e_pre_rule, e_cin, e_cin_rule, e_by, e_cpost);
  EXPECT_LE(e_cpre, 1e-5) << what;
  EXPECT_LE(e_pre_rule, 1e-5) << what;
  EXPECT_LE(e_cin, out_tol_of(c.act)) << what;
  EXPECT_EQ(e_cin_rule, 0.0) << what;
  EXPECT_LE(e_by, out_tol_of(c.act)) << what;
  EXPECT_LE(e_cpost, 1e-5) << what;

  // The expansion.
  Tensor s = Tensor::empty({T, hc, D}, DType::kF32);
  kernels::hc_expand(s, y);
  Tensor gs = Tensor::empty({T, hc, D}, DType::kF32, gpu());
  poison(gs);
  kernels::hc_expand(gs, y.to(gpu()));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const double e_exp = rel_err(host(gs), s);
  std::printf("  %s: post %.3g comb %.3g input %.3g write-back %.3g head %.3g mean %.3g expand "
              "%.3g; |column sum - 1| <= %.3g\n",
              what.c_str(), e_post, e_comb, e_in, e_wb, e_head, e_mean, e_exp, worst_col);
  const double out_tol = out_tol_of(c.act);
  EXPECT_LE(e_post, 1e-5) << what;
  EXPECT_LE(e_comb, 1e-5) << what;
  EXPECT_LE(e_in, out_tol) << what;
  EXPECT_LE(e_wb, 1e-5) << what;
  EXPECT_LE(e_head, out_tol) << what;
  EXPECT_LE(e_mean, out_tol) << what;
  EXPECT_EQ(e_exp, 0.0) << what;
  EXPECT_LE(worst_col, 1e-4) << what;
}

TEST(GpuHyperConnection, MixWriteBackHeadAndExpandMatchTheCpu) {
  const std::vector<HcCase> cases = {
      {7, 64, 4, 20, DType::kF32},      // the fixtures' width
      {33, 4096, 4, 20, DType::kBF16},  // GLM-5.3's and V4's streams at a real width
      {1, 4096, 4, 20, DType::kBF16},   // decode
      {5, 250, 3, 7, DType::kF32},      // the generic kernel, an odd width (no float4 loads)
      {3, 96, 16, 20, DType::kBF16},    // the most streams the kernels take
  };
  uint64_t seed = 9100;
  for (const HcCase& c : cases) run_hc_case(c, seed += 10);
}

// DeepSeek-V4.1's Engram gate (kernels/engram.h) on the GPU against the CPU: V4.1's four streams
// at the fixture's width and a real one, kv in F32 and BF16 (strided rows), a decode row; and
// against the rule written here in double for the F32 case.
TEST(GpuEngram, GateMatchesTheCpuAndTheRule) {
  struct Case {
    int64_t T, hc, H;
    DType kv_dtype;
  };
  uint64_t seed = 9300;
  for (const Case& c : {Case{7, 4, 64, DType::kF32}, Case{33, 4, 4096, DType::kBF16},
                        Case{1, 4, 4096, DType::kBF16}, Case{5, 3, 250, DType::kF32}}) {
    seed += 10;
    const int64_t T = c.T, hc = c.hc, H = c.H;
    Tensor x = random_cpu({T, hc, H}, DType::kF32, seed, -2, 2);
    // kv as a view with strided rows: the first (hc + 1) H columns of a wider tensor.
    Tensor wide = random_cpu({T, (hc + 1) * H + 8}, c.kv_dtype, seed + 1, -1, 1);
    Tensor kv = wide.narrow(1, 0, (hc + 1) * H);
    Tensor kw = random_cpu({hc, H}, DType::kF32, seed + 2, 0.5f, 1.5f);
    Tensor qw = random_cpu({hc, H}, DType::kF32, seed + 3, 0.5f, 1.5f);
    Tensor want = x.clone();
    kernels::engram_gate_add(want, kv, kw, qw, 1e-20f);
    Tensor gx = x.to(gpu());
    Tensor gwide = wide.to(gpu());
    kernels::engram_gate_add(gx, gwide.narrow(1, 0, (hc + 1) * H), kw.to(gpu()), qw.to(gpu()),
                             1e-20f);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const double e = rel_err(host(gx), want);
    // The rule in double.
    const Tensor kvf = to_f32_cpu(kv.contiguous());
    double worst = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < hc; ++j) {
        const float* k = kvf.ptr<float>() + t * (hc + 1) * H + j * H;
        const float* v = kvf.ptr<float>() + t * (hc + 1) * H + hc * H;
        const float* xj = x.ptr<float>() + (t * hc + j) * H;
        double sk = 0, sx = 0, p = 0;
        for (int64_t i = 0; i < H; ++i) {
          sk += static_cast<double>(k[i]) * k[i];
          sx += static_cast<double>(xj[i]) * xj[i];
          p += static_cast<double>(k[i]) * kw.ptr<float>()[j * H + i] * xj[i] *
               qw.ptr<float>()[j * H + i];
        }
        double g = p / std::sqrt(sk / H + 1e-20) / std::sqrt(sx / H + 1e-20) / std::sqrt(H);
        g = (g > 0 ? 1 : g < 0 ? -1 : 0) * std::sqrt(std::max(std::fabs(g), 1e-6));
        const double sg = 1.0 / (1.0 + std::exp(-g));
        for (int64_t i = 0; i < H; ++i)
          worst = std::max(
              worst, std::fabs(want.ptr<float>()[(t * hc + j) * H + i] - (xj[i] + sg * v[i])));
      }
    std::printf("  engram gate T %lld hc %lld H %lld %s: GPU vs CPU %.3g, CPU vs the rule %.3g\n",
                static_cast<long long>(T), static_cast<long long>(hc), static_cast<long long>(H),
                std::string(dtype_name(c.kv_dtype)).c_str(), e, worst);
    EXPECT_LE(e, 1e-5);
    EXPECT_LE(worst, 1e-4);
  }
}

TEST(GpuHyperConnection, TooManyStreamsAreRefusedByName) {
  kernels::HcArgs a;
  a.hc = 17;
  Tensor x = Tensor::empty({1, 17, 8}, DType::kF32, gpu());
  Tensor e = Tensor::empty({1, 8}, DType::kBF16, gpu());
  EXPECT_ERROR_CONTAINS(kernels::hc_expand(x, e), "17 streams", "take 1 to 16");
}

// Kimi-K3's attention residuals' mix on the GPU against the CPU: K3's 9 rows at its width, few
// and many tokens, F32 and BF16 outputs, a row count past a warp's.
TEST(GpuAttnRes, MixMatchesCpu) {
  struct Case {
    int64_t T, B, D, n;
    DType out;
  };
  for (const Case& c : {Case{1, 9, 7168, 9, DType::kBF16}, Case{37, 9, 7168, 5, DType::kF32},
                        Case{300, 4, 64, 4, DType::kF32}, Case{5, 40, 96, 40, DType::kBF16},
                        Case{3, 9, 7168, 1, DType::kF32}}) {
    Tensor bank = random_cpu({c.T, c.B, c.D}, DType::kF32, 50 + c.T, -2, 2);
    Tensor w = random_cpu({c.D}, DType::kF32, 51, -0.05f, 0.05f);
    Tensor ref = Tensor::empty({c.T, c.D}, c.out);
    kernels::attn_res(ref, bank, c.n, w, 1e-5f);
    Tensor got = Tensor::empty({c.T, c.D}, c.out, gpu());
    poison(got);
    kernels::attn_res(got, bank.to(gpu()), c.n, w.to(gpu()), 1e-5f);
    const double e = rel_err(host(got), ref);
    EXPECT_LE(e, c.out == DType::kF32 ? 1e-5 : 4e-3) << c.T << "x" << c.D << " n " << c.n;
    std::printf("attn_res T %ld n %ld D %ld %s: rel err %.3g\n", static_cast<long>(c.T),
                static_cast<long>(c.n), static_cast<long>(c.D),
                std::string(dtype_name(c.out)).c_str(), e);
  }
}

}  // namespace
}  // namespace atom::test
