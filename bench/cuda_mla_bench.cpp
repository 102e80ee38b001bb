// Absorbed multi-head latent attention decode (the FlashMLA problem) on the GPU at DeepSeek-V3
// shapes: 128 query heads (16: a tensor-parallel rank of 8, and DeepSeek-V2-Lite) over one
// latent row of 512 + 64 per token, 64-token pages (shuffled), contexts 4k-32k, batch 1-128.
// Each line: time, bytes/s (the latent rows read once per sequence, q and out), FLOP/s
// (2 H (576 + 512) per key), the fraction of the binding limit (bench_util.h), and the fraction
// of the bandwidth limit alone. With --torch FILE it writes the shapes and atom's times for
// bench/mla_decode_torch.py (the PyTorch peer, same run).
//   cuda_mla_bench [--heads 128,16] [--ctx 4096,8192,16384,32768] [--batch 1,8,32,64,128]
//                  [--sparse 2048] [--torch FILE]
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "bench_util.h"
#include "kernels/mla.h"
#include "kernels/random.h"

using namespace atom;
using bench::report;
using bench::time_op;

namespace {

const Device kGpu = Device::cuda(0);

Tensor i32_gpu(const std::vector<int32_t>& v) {
  Tensor h = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::memcpy(h.data(), v.data(), v.size() * 4);
  return h.to(kGpu);
}

struct Result {
  int heads, batch, ctx, top_k;
  double seconds;
};

Result run(int H, int B, int ctx, int top_k) {
  constexpr int L = 512, R = 64, W = L + R, bs = 64;
  const int pages_per = (ctx + bs - 1) / bs, pages = B * pages_per;
  std::vector<int32_t> perm(pages), qs{0}, cl, pip{0};
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  for (int s = 0; s < B; ++s) {
    qs.push_back(s + 1);
    cl.push_back(ctx);
    pip.push_back(pip.back() + pages_per);
  }
  Tensor cache = Tensor::empty({pages, bs, 1, W}, DType::kBF16, kGpu);
  kernels::fill_uniform(cache, 1, -1, 1);
  Tensor q = Tensor::empty({B, static_cast<int64_t>(H) * W}, DType::kBF16, kGpu);
  kernels::fill_uniform(q, 2, -1, 1);
  Tensor out = Tensor::empty({B, static_cast<int64_t>(H) * L}, DType::kBF16, kGpu);
  Tensor gqs = i32_gpu(qs), gcl = i32_gpu(cl), gpip = i32_gpu(pip), gpid = i32_gpu(perm);
  Tensor topk;
  if (top_k > 0) {
    std::vector<int32_t> sel;
    std::mt19937 rng(3);
    for (int s = 0; s < B; ++s) {
      std::vector<int32_t> p(ctx);
      std::iota(p.begin(), p.end(), 0);
      std::shuffle(p.begin(), p.end(), rng);
      for (int k = 0; k < top_k; ++k) sel.push_back(k < ctx ? p[k] : -1);
    }
    topk = i32_gpu(sel).view({B, top_k});
  }
  kernels::MlaArgs a;
  a.num_heads = H;
  a.latent_dim = L;
  a.rope_dim = R;
  a.scale = 1.0f / std::sqrt(192.0f);
  a.max_query_len = 1;
  a.max_context_len = ctx;
  kernels::AttentionBatch b{&gqs, &gcl, &gpip, &gpid};
  Tensor ws;
  const int64_t need = kernels::mla_paged_attention_workspace_size(kGpu, B, a, DType::kBF16, top_k);
  if (need > 0) {
    ws = Tensor::empty({need}, DType::kF32, kGpu);
    b.workspace = &ws;
  }
  const int splits = need > 0 ? static_cast<int>(need / (int64_t{B} * H * (L + 2))) : 1;
  const double keys = static_cast<double>(B) * (top_k > 0 ? std::min(top_k, ctx) : ctx);
  const double bytes = keys * W * 2 + static_cast<double>(B) * H * (W + L) * 2;
  const double flops = keys * H * (W + L) * 2.0;
  const int iters = bytes > 1e9 ? 10 : 20;
  const double t =
      time_op([&](int) { kernels::mla_paged_attention(out, q, cache, b, topk, a); }, iters);
  const std::string what =
      top_k > 0
          ? fmt::format("sparse MLA {} heads, batch {}, top {} of {} ({} splits)", H, B, top_k, ctx,
                        splits)
          : fmt::format("MLA decode {} heads, batch {}, ctx {} ({} splits)", H, B, ctx, splits);
  report(what, t, bytes, flops);
  std::printf("    %.1f%% of bandwidth; matmul floor %.1f us, bandwidth floor %.1f us\n",
              100.0 * bytes / t / bench::kBandwidth, flops / bench::kMatmul * 1e6,
              bytes / bench::kBandwidth * 1e6);
  return {H, B, ctx, top_k, t};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> heads{128, 16}, ctxs{4096, 8192, 16384, 32768}, batches{1, 8, 32, 64, 128};
  int sparse = 2048;
  std::string torch_file;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--heads")
      heads = bench::int_list(v);
    else if (k == "--ctx")
      ctxs = bench::int_list(v);
    else if (k == "--batch")
      batches = bench::int_list(v);
    else if (k == "--sparse")
      sparse = std::atoi(v.c_str());
    else if (k == "--torch")
      torch_file = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    std::printf("device: %s, %d SMs; limits: %.2f TB/s, %.0f TFLOP/s\n", p.name,
                p.multiProcessorCount, bench::kBandwidth / 1e12, bench::kMatmul / 1e12);
    std::vector<Result> rs;
    for (int H : heads)
      for (int c : ctxs)
        for (int B : batches) {
          if (static_cast<double>(B) * c > 128.0 * 32768) continue;
          rs.push_back(run(H, B, c, 0));
        }
    if (sparse > 0)
      for (int B : {1, 32, 128}) rs.push_back(run(128, B, 32768, sparse));
    if (!torch_file.empty()) {
      FILE* f = std::fopen(torch_file.c_str(), "w");
      for (const Result& r : rs)
        if (r.top_k == 0 && (r.batch == 1 || r.batch == 32 || r.batch == 128))
          std::fprintf(f, "%d %d %d %.3f\n", r.heads, r.batch, r.ctx, r.seconds * 1e6);
      std::fclose(f);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
