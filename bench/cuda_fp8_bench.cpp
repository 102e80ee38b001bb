// FP8 linear benchmarks on the GPU (kernels::linear_fp8):
//   gemm:   the block-scaled GEMM (128x128 weight blocks, 1x128 dynamic activation groups) at
//           DeepSeek-V3 shapes, M = 16 ... 8192, N in {7168, 2112, 24576}, K in {7168, 16384};
//           the wgmma kernel alone (activations quantised once, outside the timing) and the whole
//           call (quantisation + GEMM); cuBLASLt's FP8 matmul (linear_fp8_cublaslt.cpp) beside
//           them, and at the same shapes the per-channel/per-token and per-tensor GEMMs alone
//           (atom's TMA kernel, cuBLASLt); and the per-channel/token-dynamic whole call.
//   skinny: the decode path (M = 1..4) at N x K = 7168 x 7168, 2112 x 7168, 4096 x 14336, W8A16
//           (kNone) and block-quantised activations, as weight bytes/s against the 4.29 TB/s
//           weight-read limit (bench_util.h). Weights are rotated past the 50 MB L2.
// Each GEMM line prints TFLOP/s and the fraction of --peak (FLOP/s; the FP8 matmul peak the peer
// script bench/fp8_gemm_torch.py measures with torch._scaled_mm on this machine in the same run).
//   quant:  the activation quantisation alone, one pass against two passes, as bytes/s.
//   ragged: the block-scaled call at M % 4 != 0, cut between cuBLASLt and a tail, or not.
//   cuda_fp8_bench [gemm|skinny|quant|ragged|all] [--peak FLOPS] [--quick]
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kernels/cuda/linear_fp8_config.h"
#include "kernels/cuda/linear_fp8_launch.h"
#include "kernels/linear_fp8.h"
#include "kernels/random.h"

using namespace atom;
using bench::time_op;

namespace {

const Device kGpu = Device::cuda(0);
double g_peak = 0;  // FP8 matmul FLOP/s (from --peak)

Tensor rnd(Shape s, DType dt, uint64_t seed, float lo = -1, float hi = 1) {
  Tensor t = Tensor::empty(std::move(s), dt, kGpu);
  kernels::fill_uniform(t, seed, lo, hi);
  return t;
}

// Random finite e4m3 codes (|value| < 32): a 16 MB host pool of them, copied into the tensor
// from a seed-dependent offset (the bandwidth and the tensor cores see ordinary random data).
Tensor rnd_f8(int64_t n, int64_t k, uint64_t seed) {
  static std::vector<uint8_t> pool = [] {
    std::vector<uint8_t> p(16 << 20);
    std::mt19937_64 rng(1);
    for (auto& c : p) {
      c = static_cast<uint8_t>(rng());
      if ((c & 0x78) >= 0x60) c &= 0xd7;  // keep |value| < 32 (no NaN)
    }
    return p;
  }();
  Tensor t = Tensor::empty({n, k}, DType::kF8E4M3, kGpu);
  const int64_t total = n * k, psz = static_cast<int64_t>(pool.size());
  int64_t off = static_cast<int64_t>((seed * 7919) % static_cast<uint64_t>(psz / 2));
  for (int64_t done = 0; done < total;) {
    const int64_t len = std::min(total - done, psz - off);
    CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(t.data()) + done, pool.data() + off, len,
                          cudaMemcpyHostToDevice));
    done += len;
    off = 0;
  }
  return t;
}

kernels::Fp8Weight block_weight(int64_t n, int64_t k, uint64_t seed) {
  kernels::Fp8Weight w;
  w.w = rnd_f8(n, k, seed);
  w.scale = rnd({(n + 127) / 128, (k + 127) / 128}, DType::kF32, seed + 1, 0.002f, 0.006f);
  w.granularity = kernels::Fp8Granularity::kBlock;
  w.activation = kernels::Fp8Activation::kBlockDynamic;
  return w;
}

void line(const std::string& what, double t, double flops, double bytes) {
  CUDA_CHECK(cudaGetLastError());
  const double fl = flops / t;
  std::printf("%-60s %9.1f us %8.1f TFLOP/s %6.1f%% of FP8 peak %7.3f TB/s\n", what.c_str(),
              t * 1e6, fl / 1e12, g_peak > 0 ? 100.0 * fl / g_peak : 0.0, bytes / t / 1e12);
  std::fflush(stdout);
}

// cuBLASLt's FP8 matmul alone on quantised activations (`g`, the weight rotated over `ws`, its
// scales from `scale_of`), or what cuBLASLt said when it has no algorithm for the product.
template <typename ScaleOf>
void lt_gemm(const std::string& what, kernels::cuda::Fp8GemmArgs g,
             const std::vector<kernels::Fp8Weight>& ws, int iters, double flops, double bytes,
             ScaleOf scale_of) {
  g.w = ws[0].w.ptr<uint8_t>();
  g.sw = scale_of(ws[0]);
  const std::string why = kernels::cuda::fp8_gemm_cublaslt_status(g, nullptr);
  if (!why.empty()) {
    std::printf("%-60s cuBLASLt: %s\n", what.c_str(), why.c_str());
    return;
  }
  const double t = time_op(
      [&](int i) {
        const kernels::Fp8Weight& w = ws[i % ws.size()];
        g.w = w.w.ptr<uint8_t>();
        g.sw = scale_of(w);
        kernels::cuda::launch_fp8_gemm_cublaslt(g, nullptr);
      },
      iters);
  line(what, t, flops, bytes);
}

// The wgmma kernel alone on activations quantised once (the time DeepGEMM reports), and the whole
// linear_fp8 call.
void bench_gemm(bool quick) {
  std::printf("\n== FP8 block GEMM (128x128 weight blocks, 1x128 activation groups), bf16 out\n");
  struct NK {
    int64_t n, k;
  };
  const NK shapes[] = {{2112, 7168},  {7168, 7168},  {24576, 7168},
                       {2112, 16384}, {7168, 16384}, {24576, 16384}};
  std::vector<int64_t> ms = {16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
  if (quick) ms = {128, 4096};
  kernels::cuda::CudaTuning no_skinny = kernels::cuda::cuda_tuning();
  no_skinny.fp8_path = kernels::cuda::Fp8Path::kNoSkinny;
  const kernels::cuda::CudaTuningScope no_skinny_scope(no_skinny);
  for (const NK& s : shapes) {
    const double wbytes = static_cast<double>(s.n) * s.k;
    const int copies = static_cast<int>(std::max(1.0, std::ceil(200e6 / wbytes)));
    std::vector<kernels::Fp8Weight> ws;
    for (int c = 0; c < copies; ++c) ws.push_back(block_weight(s.n, s.k, 10 + c));
    const Tensor chan_scale = rnd({s.n}, DType::kF32, 7, 0.002f, 0.006f);
    const Tensor tensor_scale = rnd({1}, DType::kF32, 8, 0.002f, 0.006f);
    for (int64_t m : ms) {
      Tensor x = rnd({m, s.k}, DType::kBF16, 5, -2, 2);
      Tensor y = Tensor::empty({m, s.n}, DType::kBF16, kGpu);
      const int64_t wsb = kernels::cuda::linear_fp8_workspace_bytes(m, s.k, ws[0]);
      Tensor work = Tensor::empty({wsb + 256}, DType::kU8, kGpu);
      const double flops = 2.0 * m * s.n * s.k;
      const double bytes = wbytes + static_cast<double>(m) * s.k + 2.0 * m * s.n;
      const int iters = flops > 2e12 ? 3 : flops > 2e11 ? 10 : 30;
      // Whole call on atom's kernels (cuBLASLt off; the default dispatch is printed beside it).
      const std::string auto_kernel = kernels::cuda::linear_fp8_kernel_for(x, ws[0], y);
      kernels::cuda::CudaTuning off = kernels::cuda::cuda_tuning();
      off.fp8_cublaslt = kernels::cuda::Fp8CublasLt::kOff;
      std::string atom_kernel;
      double t_all = 0;
      {
        const kernels::cuda::CudaTuningScope scope(off);
        atom_kernel = kernels::cuda::linear_fp8_kernel_for(x, ws[0], y);
        t_all = time_op([&](int i) { kernels::linear_fp8(y, x, ws[i % copies], Tensor(), work); },
                        iters);
      }
      // GEMM alone: the quantised activations stay in the workspace from the last call.
      kernels::cuda::Fp8GemmArgs g;
      g.out = {y.data(), m, s.n, s.n, kernels::cuda::Elem::kBF16};
      g.act = kernels::cuda::Fp8Act::kBlock;
      g.m = m;
      g.n = s.n;
      g.k = s.k;
      g.gran = kernels::cuda::Fp8Gran::kBlock;
      g.a.ldq = (s.k + 15) / 16 * 16;
      g.a.ld_sx = (m + 3) / 4 * 4;
      g.a.group = 128;
      g.a.xq = static_cast<uint8_t*>(work.data());
      g.a.sx = reinterpret_cast<float*>(static_cast<uint8_t*>(work.data()) +
                                        (m * g.a.ldq + 255) / 256 * 256);
      for (bool tma : {true, false}) {
        const double t_gemm = time_op(
            [&](int i) {
              g.w = ws[i % copies].w.ptr<uint8_t>();
              g.sw = ws[i % copies].scale.ptr<float>();
              tma ? kernels::cuda::launch_fp8_gemm_tma(g, nullptr)
                  : kernels::cuda::launch_fp8_gemm_wgmma(g, nullptr);
            },
            iters);
        line(fmt::format("block M={} N={} K={} GEMM {}", m, s.n, s.k,
                         tma ? "tma 128x256" : "cp.async 128x128"),
             t_gemm, flops, bytes);
      }
      // cuBLASLt on the same quantised activations (its 1x128 scales read as [K / 128, M]).
      kernels::cuda::Fp8GemmArgs gl = g;
      gl.a.ld_sx = m;
      lt_gemm(fmt::format("block M={} N={} K={} GEMM cublaslt", m, s.n, s.k), gl, ws, iters, flops,
              bytes, [](const kernels::Fp8Weight& w) { return w.scale.ptr<float>(); });
      line(fmt::format("block M={} N={} K={} quant + GEMM ({}; auto: {})", m, s.n, s.k, atom_kernel,
                       auto_kernel),
           t_all, flops, bytes);
      {
        kernels::cuda::CudaTuning on = kernels::cuda::cuda_tuning();
        on.fp8_cublaslt = kernels::cuda::Fp8CublasLt::kOn;
        const kernels::cuda::CudaTuningScope scope(on);
        if (std::string(kernels::cuda::linear_fp8_kernel_for(x, ws[0], y)) == "cublaslt") {
          const double t = time_op(
              [&](int i) { kernels::linear_fp8(y, x, ws[i % copies], Tensor(), work); }, iters);
          line(fmt::format("block M={} N={} K={} quant + GEMM (cublaslt)", m, s.n, s.k), t, flops,
               bytes);
        }
      }
      // The other scalings' GEMMs on the same operands (the activation codes reused; one
      // scale per token, and the weight's per channel or per tensor): atom's TMA kernel and
      // cuBLASLt (outer vectors; scalars).
      for (const bool channel : {true, false}) {
        kernels::cuda::Fp8GemmArgs gc = g;
        gc.gran = channel ? kernels::cuda::Fp8Gran::kChannel : kernels::cuda::Fp8Gran::kTensor;
        gc.act = channel ? kernels::cuda::Fp8Act::kToken : kernels::cuda::Fp8Act::kStatic;
        gc.a.group = s.k;
        const float* sw = channel ? chan_scale.ptr<float>() : tensor_scale.ptr<float>();
        const char* what = channel ? "channel/token" : "tensor/static";
        const double t = time_op(
            [&](int i) {
              gc.w = ws[i % copies].w.ptr<uint8_t>();
              gc.sw = sw;
              kernels::cuda::launch_fp8_gemm_tma(gc, nullptr);
            },
            iters);
        line(fmt::format("{} M={} N={} K={} GEMM tma 128x256", what, m, s.n, s.k), t, flops, bytes);
        lt_gemm(fmt::format("{} M={} N={} K={} GEMM cublaslt", what, m, s.n, s.k), gc, ws, iters,
                flops, bytes, [&](const kernels::Fp8Weight&) { return sw; });
      }
    }
  }
  std::printf("\n== FP8 per-channel weight, per-token dynamic activations (wgmma), bf16 out\n");
  for (const NK& s : {NK{7168, 7168}, NK{24576, 7168}}) {
    kernels::Fp8Weight w;
    w.w = rnd_f8(s.n, s.k, 3);
    w.scale = rnd({s.n}, DType::kF32, 4, 0.002f, 0.006f);
    w.granularity = kernels::Fp8Granularity::kChannel;
    w.activation = kernels::Fp8Activation::kTokenDynamic;
    for (int64_t m : quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{512, 4096, 8192}) {
      Tensor x = rnd({m, s.k}, DType::kBF16, 5, -2, 2);
      Tensor y = Tensor::empty({m, s.n}, DType::kBF16, kGpu);
      Tensor work = Tensor::empty({kernels::cuda::linear_fp8_workspace_bytes(m, s.k, w) + 256},
                                  DType::kU8, kGpu);
      const double flops = 2.0 * m * s.n * s.k;
      for (int v = 0; v < 3; ++v) {
        kernels::cuda::CudaTuning tuning = kernels::cuda::cuda_tuning();
        tuning.fp8_tiles =
            v == 1 ? kernels::cuda::Fp8Tiles::kCpAsync : kernels::cuda::Fp8Tiles::kTma;
        tuning.fp8_cublaslt =
            v == 2 ? kernels::cuda::Fp8CublasLt::kOn : kernels::cuda::Fp8CublasLt::kOff;
        const kernels::cuda::CudaTuningScope scope(tuning);
        CUDA_CHECK(cudaGetLastError());
        const double t = time_op([&](int) { kernels::linear_fp8(y, x, w, Tensor(), work); }, 5);
        line(fmt::format("channel/token M={} N={} K={} quant + GEMM ({})", m, s.n, s.k,
                         kernels::cuda::linear_fp8_kernel_for(x, w, y)),
             t, flops, static_cast<double>(s.n) * s.k);
      }
    }
  }
}

void bench_skinny() {
  std::printf("\n== FP8 skinny decode GEMV: weight bytes/s against %.2f TB/s\n",
              bench::kBandwidth / 1e12);
  struct NK {
    int64_t n, k;
  };
  for (const NK& s : {NK{7168, 7168}, NK{2112, 7168}, NK{4096, 14336}}) {
    const double wbytes = static_cast<double>(s.n) * s.k;
    const int copies = static_cast<int>(std::max(2.0, std::ceil(300e6 / wbytes)));
    for (auto act : {kernels::Fp8Activation::kNone, kernels::Fp8Activation::kBlockDynamic}) {
      std::vector<kernels::Fp8Weight> ws;
      for (int c = 0; c < copies; ++c) {
        ws.push_back(block_weight(s.n, s.k, 30 + c));
        ws.back().activation = act;
      }
      for (int64_t m : {1, 2, 3, 4})
        for (int rows : {2, 4}) {
          kernels::cuda::CudaTuning tuning = kernels::cuda::cuda_tuning();
          tuning.fp8_skinny_rows = rows;
          const kernels::cuda::CudaTuningScope scope(tuning);
          Tensor x = rnd({m, s.k}, DType::kBF16, 5, -2, 2);
          Tensor y = Tensor::empty({m, s.n}, DType::kBF16, kGpu);
          Tensor work = Tensor::empty(
              {kernels::cuda::linear_fp8_workspace_bytes(m, s.k, ws[0]) + 256}, DType::kU8, kGpu);
          const double t = time_op(
              [&](int i) { kernels::linear_fp8(y, x, ws[i % copies], Tensor(), work); }, 50);
          CUDA_CHECK(cudaGetLastError());
          const double bytes = wbytes + wbytes / (128.0 * 128.0) * 4;
          std::printf("%-60s %9.2f us %7.3f TB/s %6.1f%% of weight-read limit\n",
                      fmt::format("skinny {} M={} N={} K={} rows/block {}",
                                  act == kernels::Fp8Activation::kNone ? "W8A16" : "block-quant", m,
                                  s.n, s.k, rows)
                          .c_str(),
                      t * 1e6, bytes / t / 1e12, 100.0 * bytes / t / bench::kBandwidth);
          std::fflush(stdout);
        }
    }
  }
}

// Ragged M (M % 4 != 0, which cuBLASLt cannot run with 1x128 groups): the whole block-scaled call
// with the cut (cuBLASLt for M - M % 4 rows, the skinny kernel for the rest; the default) against
// atom's GEMM for all of it (ATOM_FP8_CUBLASLT_SPLIT=0), and the call at M - 1 rows (a multiple of
// 4: cuBLASLt alone) beside them, in the same run.
void bench_ragged() {
  std::printf("\n== FP8 block call at M %% 4 != 0: cuBLASLt + tail against atom's GEMM\n");
  struct NK {
    int64_t n, k;
  };
  for (const NK& s : {NK{2112, 7168}, NK{7168, 7168}, NK{24576, 7168}, NK{7168, 16384}}) {
    const double wbytes = static_cast<double>(s.n) * s.k;
    const int copies = static_cast<int>(std::max(1.0, std::ceil(200e6 / wbytes)));
    std::vector<kernels::Fp8Weight> ws;
    for (int c = 0; c < copies; ++c) ws.push_back(block_weight(s.n, s.k, 10 + c));
    for (const int64_t m : {1025, 2049, 4097, 8193}) {
      double t[3];
      for (int v = 0; v < 3; ++v) {
        const int64_t rows = v == 2 ? m - 1 : m;
        Tensor x = rnd({rows, s.k}, DType::kBF16, 5, -2, 2);
        Tensor y = Tensor::empty({rows, s.n}, DType::kBF16, kGpu);
        Tensor work = Tensor::empty(
            {kernels::cuda::linear_fp8_workspace_bytes(rows, s.k, ws[0]) + 256}, DType::kU8, kGpu);
        const kernels::cuda::CudaTuningScope scope(kernels::cuda::cuda_tuning_with(
            [&](kernels::cuda::CudaTuning& c) { c.fp8_cublaslt_split = v != 1; }));
        const double flops = 2.0 * rows * s.n * s.k;
        t[v] = time_op([&](int i) { kernels::linear_fp8(y, x, ws[i % copies], Tensor(), work); },
                       flops > 2e12 ? 3 : 10);
        CUDA_CHECK(cudaGetLastError());
      }
      std::printf("N=%-6lld K=%-6lld M=%-5lld cut %9.1f us   atom GEMM %9.1f us (%.2fx)   M-1 "
                  "(cuBLASLt) %9.1f us\n",
                  static_cast<long long>(s.n), static_cast<long long>(s.k),
                  static_cast<long long>(m), t[0] * 1e6, t[1] * 1e6, t[1] / t[0], t[2] * 1e6);
      std::fflush(stdout);
    }
  }
}

// The activation quantisation alone (what the whole call adds to the GEMM): one pass (default)
// and the two-pass kernel (ATOM_FP8_QUANT_ONE_PASS=0) in the same run, 1x128 groups and per-token,
// BF16 rows of K in {2048, 7168, 16384}; bytes: the BF16 read, the e4m3 codes and the scales
// written, against the bandwidth limit (bench_util.h).
void bench_quant() {
  std::printf("\n== FP8 activation quantisation alone (BF16 in, e4m3 + fp32 scales out)\n");
  for (const auto mode : {kernels::cuda::Fp8Act::kBlock, kernels::cuda::Fp8Act::kToken})
    for (const int64_t k : {2048, 7168, 16384})
      for (const int64_t m : {1, 16, 128, 1024, 4096, 8192}) {
        const Tensor x = rnd({m, k}, DType::kBF16, 3, -2, 2);
        const int64_t group = mode == kernels::cuda::Fp8Act::kBlock ? 128 : k;
        const int64_t G = (k + group - 1) / group, ld_sx = (m + 3) / 4 * 4;
        Tensor xq = Tensor::empty({m, k}, DType::kU8, kGpu);
        Tensor sx = Tensor::empty({G * ld_sx}, DType::kF32, kGpu);
        const kernels::cuda::Fp8Act8 a{static_cast<uint8_t*>(xq.data()), k, sx.ptr<float>(), ld_sx,
                                       group};
        const kernels::cuda::Mat xm{x.data(), m, k, k, kernels::cuda::Elem::kBF16};
        const double bytes = 3.0 * m * k + 4.0 * G * m;
        double t[2];
        for (const int one_pass : {1, 0}) {
          const kernels::cuda::CudaTuningScope scope(kernels::cuda::cuda_tuning_with(
              [&](kernels::cuda::CudaTuning& c) { c.fp8_quant_one_pass = one_pass != 0; }));
          t[one_pass] = time_op(
              [&](int) { kernels::cuda::launch_fp8_act_quant(xm, mode, nullptr, a, nullptr); },
              m * k > (int64_t{1} << 24) ? 20 : 100);
          CUDA_CHECK(cudaGetLastError());
        }
        std::printf("%-6s M=%-5lld K=%-6lld one pass %8.1f us %6.3f TB/s (%5.1f%% of limit)  "
                    "two pass %8.1f us %6.3f TB/s  (%.2fx)\n",
                    mode == kernels::cuda::Fp8Act::kBlock ? "1x128" : "token",
                    static_cast<long long>(m), static_cast<long long>(k), t[1] * 1e6,
                    bytes / t[1] / 1e12, 100.0 * bytes / bench::kBandwidth / t[1], t[0] * 1e6,
                    bytes / t[0] / 1e12, t[0] / t[1]);
        std::fflush(stdout);
      }
}

}  // namespace

int main(int argc, char** argv) {
  std::string what = "all";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--peak") && i + 1 < argc)
      g_peak = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else
      what = argv[i];
  }
  if (what == "gemm" || what == "all") bench_gemm(quick);
  if (what == "skinny" || what == "all") bench_skinny();
  if (what == "quant" || what == "all") bench_quant();
  if (what == "ragged" || what == "all") bench_ragged();
  return 0;
}
