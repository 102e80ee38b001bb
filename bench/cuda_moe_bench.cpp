// fused_moe alone on the GPU: Qwen3-30B-A3B's expert shapes (H 2048, I 768, E 128, top-8, bf16)
// at decode batches (bandwidth: the bytes of the distinct experts a call touches plus the
// activations, over 4.29 TB/s) and at 2k / 16k routed rows and 16k tokens (compute:
// 2 * 3 * H * I FLOP per routed row, over 797 TFLOP/s), and Mixtral-8x7B's (H 4096, I 14336,
// E 8, top-2) at batch 1, and gpt-oss-20b's (H 2880, I 2880, E 32, top-4, the clamped SwiGLU
// with expert biases) at decode batches and 8k routed rows. Routing is uniform top-k without
// repeats, a different draw for each timed call (8 draws rotated), so the experts a call reads
// are not left in L2 by the one before. Qwen3-30B-A3B's experts also run as Qwen3-30B-A3B-FP8
// ships them (e4m3 with 128x128 block scales, W8A16: the kernels expand them to BF16 as they load
// them), beside the BF16 cases in the same run.
//   cuda_moe_bench [--counts FILE] [--paths] [--mxfp4-only] [--fp8-only]
// --counts writes the per-expert row counts of the 2k- and 16k-routed-row cases (one line each)
// for bench/moe_grouped_mm_torch.py, which times torch._grouped_mm on the same distribution.
// --paths also times both fused_moe paths (decode kernels, grouped GEMMs) at a few batches.
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kernels/cuda_tuning.h"
#include "kernels/moe.h"
#include "kernels/random.h"

using namespace atom;
using bench::report;
using bench::time_op;
using kernels::cuda::cuda_tuning_with;
using kernels::cuda::CudaTuning;
using Tuned = kernels::cuda::CudaTuningScope;

namespace {

const Device kGpu = Device::cuda(0);

Tensor rnd(Shape s, DType dt, uint64_t seed, float lo = -1, float hi = 1) {
  Tensor t = Tensor::empty(std::move(s), dt, kGpu);
  kernels::fill_uniform(t, seed, lo, hi);
  return t;
}

struct Model {
  const char* name;
  int64_t H, I, E;
  int K;
  bool gpt_oss = false;  // the clamped SwiGLU with expert biases
};

struct Routing {
  std::vector<Tensor> ids, wts;  // rotated draws
  double distinct = 0;           // mean distinct experts per draw
  std::vector<int> counts;       // rows per expert of the first draw
};

Routing draw(const Model& m, int64_t T, int draws, uint64_t seed) {
  Routing r;
  std::mt19937_64 rng(seed);
  std::vector<int32_t> perm(static_cast<size_t>(m.E));
  r.counts.assign(static_cast<size_t>(m.E), 0);
  for (int d = 0; d < draws; ++d) {
    Tensor ids = Tensor::empty({T, m.K}, DType::kI32), wts = Tensor::empty({T, m.K}, DType::kF32);
    std::set<int32_t> seen;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t e = 0; e < m.E; ++e) perm[e] = static_cast<int32_t>(e);
      for (int j = 0; j < m.K; ++j) {
        std::swap(perm[j], perm[j + static_cast<int64_t>(rng() % (m.E - j))]);
        ids.ptr<int32_t>()[t * m.K + j] = perm[j];
        wts.ptr<float>()[t * m.K + j] = 1.0f / m.K;
        seen.insert(perm[j]);
        if (d == 0) ++r.counts[perm[j]];
      }
    }
    r.distinct += static_cast<double>(seen.size()) / draws;
    r.ids.push_back(ids.to(kGpu));
    r.wts.push_back(wts.to(kGpu));
  }
  return r;
}

void bench_case(const Model& m, const Tensor& w13, const Tensor& w2, int64_t T,
                const std::string& tag, FILE* counts_out, const Tensor* b13 = nullptr,
                const Tensor* b2 = nullptr, const Tensor* s13 = nullptr, const Tensor* s2 = nullptr,
                int fp8_block = 0) {
  const int draws = 8;
  Routing r = draw(m, T, draws, 77 + static_cast<uint64_t>(T));
  Tensor x = rnd({T, m.H}, DType::kBF16, 5);
  Tensor out = Tensor::empty({T, m.H}, DType::kBF16, kGpu);
  kernels::MoeExperts ex;
  ex.w13 = &w13;
  ex.w2 = &w2;
  ex.w13_bias = b13;
  ex.w2_bias = b2;
  ex.w13_scales = s13;
  ex.w2_scales = s2;
  ex.fp8_block_n = ex.fp8_block_k = fp8_block;
  if (m.gpt_oss) ex.activation.kind = kernels::MoeActivation::kSwigluOai;
  const int64_t wsb = kernels::fused_moe_workspace_bytes(kGpu, T, m.K, ex, DType::kBF16);
  Tensor ws = Tensor::empty({std::max<int64_t>(wsb, 1)}, DType::kU8, kGpu);
  const int64_t rows = T * m.K;
  // MXFP4: half a byte a weight plus a scale byte per 32; FP8: a byte a weight plus 4 per block
  const double weight_bytes = fp8_block ? 3.0 * m.H * m.I * (1.0 + 4.0 / (fp8_block * fp8_block))
                              : s13     ? 3.0 * m.H * m.I * (0.5 + 1.0 / 32)
                                        : 3.0 * m.H * m.I * 2;
  const double expert_bytes = weight_bytes + (b13 ? 2.0 * m.I * 2 : 0) + (b2 ? m.H * 2 : 0);
  const double bytes = r.distinct * expert_bytes + 2.0 * T * m.H * 2;
  const double flops = 2.0 * 3.0 * m.H * m.I * rows;
  const int iters = rows >= 100000 ? 5 : rows >= 10000 ? 10 : 50;
  const double t = time_op(
      [&](int i) { kernels::fused_moe(out, x, ex, r.ids[i % draws], r.wts[i % draws], &ws); },
      iters);
  report(fmt::format("{} T={} top-{} ({} rows, {:.1f} experts){}", m.name, T, m.K, rows, r.distinct,
                     tag),
         t, bytes, flops);
  if (counts_out) {
    std::fprintf(counts_out, "%lld %lld %lld %.3f", static_cast<long long>(rows),
                 static_cast<long long>(m.H), static_cast<long long>(m.I), t * 1e6);
    for (int c : r.counts) std::fprintf(counts_out, " %d", c);
    std::fprintf(counts_out, "\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string counts_path;
  bool paths = false;
  bool mxfp4_only = false;  // only the MXFP4 gpt-oss cases
  bool fp8_only = false;    // only the FP8 and BF16 qwen3-30b-a3b cases
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--counts") && i + 1 < argc) counts_path = argv[++i];
    if (!std::strcmp(argv[i], "--paths")) paths = true;
    if (!std::strcmp(argv[i], "--mxfp4-only")) mxfp4_only = true;
    if (!std::strcmp(argv[i], "--fp8-only")) fp8_only = true;
  }
  FILE* counts = counts_path.empty() ? nullptr : std::fopen(counts_path.c_str(), "w");
  std::printf("== fused_moe (bf16, fp32 accumulate): bandwidth counts the distinct experts' "
              "weights + x + out; FLOP = 6 H I per routed row\n");
  if (fp8_only) {
    // Qwen3-30B-A3B's experts in BF16 and in FP8 (128x128 blocks), the same batches.
    const Model q{"qwen3-30b-a3b", 2048, 768, 128, 8};
    const Model q8{"qwen3-30b-a3b fp8", 2048, 768, 128, 8};
    Tensor w13 = rnd({q.E, 2 * q.I, q.H}, DType::kBF16, 1, -0.02f, 0.02f);
    Tensor w2 = rnd({q.E, q.H, q.I}, DType::kBF16, 2, -0.02f, 0.02f);
    Tensor c13 = rnd({q.E, 2 * q.I, q.H}, DType::kF8E4M3, 1, -224.0f, 224.0f);
    Tensor c2 = rnd({q.E, q.H, q.I}, DType::kF8E4M3, 2, -224.0f, 224.0f);
    Tensor s13 = rnd({q.E, 2 * q.I / 128, q.H / 128}, DType::kF32, 3, 1e-4f, 2e-4f);
    Tensor s2 = rnd({q.E, q.H / 128, q.I / 128}, DType::kF32, 4, 1e-4f, 2e-4f);
    for (int64_t T : {1, 2, 8, 32, 64, 256, 2048, 16384}) {
      bench_case(q, w13, w2, T, "", nullptr);
      bench_case(q8, c13, c2, T, "", nullptr, nullptr, nullptr, &s13, &s2, 128);
    }
    if (paths)
      for (int64_t T : {1, 8, 32, 64}) {
        {
          const Tuned s(cuda_tuning_with([](CudaTuning& t) { t.moe_decode_max_rows_fp8 = 0; }));
          bench_case(q8, c13, c2, T, " gemm path", nullptr, nullptr, nullptr, &s13, &s2, 128);
        }
        for (int depth : {2, 4}) {
          const Tuned s(cuda_tuning_with(
              [&](CudaTuning& t) { t.moe_decode_max_rows_fp8 = 512, t.moe_decode_depth = depth; }));
          bench_case(q8, c13, c2, T, fmt::format(" decode path, depth {}", depth), nullptr, nullptr,
                     nullptr, &s13, &s2, 128);
        }
      }
    return 0;
  }
  if (!mxfp4_only) {
    const Model q{"qwen3-30b-a3b", 2048, 768, 128, 8};
    Tensor w13 = rnd({q.E, 2 * q.I, q.H}, DType::kBF16, 1, -0.02f, 0.02f);
    Tensor w2 = rnd({q.E, q.H, q.I}, DType::kBF16, 2, -0.02f, 0.02f);
    for (int64_t T : {1, 32}) bench_case(q, w13, w2, T, "", nullptr);
    for (int64_t T : {256, 2048}) bench_case(q, w13, w2, T, "", counts);
    bench_case(q, w13, w2, 16384, "", nullptr);
    if (paths) {
      for (int64_t T : {256, 1024, 2048, 16384})
        for (int rows : {64, 128}) {
          const Tuned s(cuda_tuning_with([&](CudaTuning& t) { t.moe_gemm_tile_rows = rows; }));
          bench_case(q, w13, w2, T, fmt::format(" gemm tiles of {}", rows), nullptr);
        }
      for (int64_t T : {1, 2, 4, 8, 16, 32}) {
        {
          const Tuned s(cuda_tuning_with([](CudaTuning& t) { t.moe_decode_max_rows = 0; }));
          bench_case(q, w13, w2, T, " gemm path", nullptr);
        }
        for (int depth : {2, 4}) {
          const Tuned s(cuda_tuning_with(
              [&](CudaTuning& t) { t.moe_decode_max_rows = 512, t.moe_decode_depth = depth; }));
          bench_case(q, w13, w2, T, fmt::format(" decode path, depth {}", depth), nullptr);
        }
      }
    }
  }
  if (!mxfp4_only) {
    const Model m{"mixtral-8x7b", 4096, 14336, 8, 2};
    Tensor w13 = rnd({m.E, 2 * m.I, m.H}, DType::kBF16, 3, -0.02f, 0.02f);
    Tensor w2 = rnd({m.E, m.H, m.I}, DType::kBF16, 4, -0.02f, 0.02f);
    for (int64_t T : {1, 4}) bench_case(m, w13, w2, T, "", nullptr);
    if (paths) {
      for (int64_t T : {1, 4, 8}) {
        {
          const Tuned s(cuda_tuning_with([](CudaTuning& t) { t.moe_decode_max_rows = 0; }));
          bench_case(m, w13, w2, T, " gemm path", nullptr);
        }
        const Tuned s(cuda_tuning_with(
            [](CudaTuning& t) { t.moe_decode_max_rows = 512, t.moe_decode_depth = 4; }));
        bench_case(m, w13, w2, T, " decode path, depth 4", nullptr);
      }
    }
  }
  if (!mxfp4_only) {
    const Model g{"gpt-oss-20b", 2880, 2880, 32, 4, true};
    Tensor w13 = rnd({g.E, 2 * g.I, g.H}, DType::kBF16, 5, -0.02f, 0.02f);
    Tensor w2 = rnd({g.E, g.H, g.I}, DType::kBF16, 6, -0.02f, 0.02f);
    Tensor b13 = rnd({g.E, 2 * g.I}, DType::kBF16, 7, -0.1f, 0.1f);
    Tensor b2 = rnd({g.E, g.H}, DType::kBF16, 8, -0.1f, 0.1f);
    for (int64_t T : {1, 2, 32, 2048}) bench_case(g, w13, w2, T, "", nullptr, &b13, &b2);
  }
  // gpt-oss-20b's and gpt-oss-120b's experts as they ship: MXFP4 blocks and e8m0 scales (W4A16:
  // the kernels expand them to BF16 as they load them).
  for (const Model& g : {Model{"gpt-oss-20b mxfp4", 2880, 2880, 32, 4, true},
                         Model{"gpt-oss-120b mxfp4", 2880, 2880, 128, 4, true}}) {
    auto bytes = [](Shape sh, uint64_t seed, int lo, int hi) {
      Tensor t = Tensor::empty(std::move(sh), DType::kU8, kGpu);
      kernels::fill_uniform_bytes(t, seed, lo, hi);
      return t;
    };
    Tensor w13 = bytes({g.E, 2 * g.I, g.H / 2}, 9, 0, 255),
           w2 = bytes({g.E, g.H, g.I / 2}, 10, 0, 255);
    Tensor s13 = bytes({g.E, g.H / 32, 2 * g.I}, 11, 118, 120);
    Tensor s2 = bytes({g.E, g.I / 32, g.H}, 12, 118, 120);
    Tensor b13 = rnd({g.E, 2 * g.I}, DType::kBF16, 7, -0.1f, 0.1f);
    Tensor b2 = rnd({g.E, g.H}, DType::kBF16, 8, -0.1f, 0.1f);
    for (int64_t T : {1, 2, 32, 2048, 8192})
      bench_case(g, w13, w2, T, "", nullptr, &b13, &b2, &s13, &s2);
    if (paths) {
      for (int64_t T : {1, 2, 8, 16, 32, 64}) {
        {
          const Tuned s(cuda_tuning_with([](CudaTuning& t) { t.moe_decode_max_rows_mxfp4 = 0; }));
          bench_case(g, w13, w2, T, " gemm path", nullptr, &b13, &b2, &s13, &s2);
        }
        for (int depth : {2, 4}) {
          const Tuned s(cuda_tuning_with([&](CudaTuning& t) {
            t.moe_decode_max_rows_mxfp4 = 512, t.moe_decode_depth = depth;
          }));
          bench_case(g, w13, w2, T, fmt::format(" decode path, depth {}", depth), nullptr, &b13,
                     &b2, &s13, &s2);
        }
      }
    }
  }
  if (counts) std::fclose(counts);
  return 0;
}
