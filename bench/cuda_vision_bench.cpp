// Vision tower throughput and the time to first token of a one-image chat, on one GPU:
//   cuda_vision_bench --model DIR [--sizes 448,1024] [--text 32] [--load-format dummy]
//                     [--backends flash,gemm] [--reps 6] [--ttft 1]
// (--backends flash --reps 2 --ttft 0: few enough kernels to run under ncu)
// DIR: a multimodal model (Kimi-K2.5, Kimi-K3) with its text layers cut to fit; weights random.
// For each square image size: the processor's grid for that size (vision::image_grid), the
// tower and projector (MoonVit::encode, host to host: pixel upload, features back in F32) timed
// over several runs, images per second and the fraction of the matmul rate its FLOPs reach;
// then the time to first token of one image plus `text` prompt tokens: the tower, then the
// prefill of the expanded prompt (a fresh cache each time) up to the first token's logits.
// The tower runs with each attention path (ATOM_ENCODER_ATTENTION flash, gemm).
// bench/vision_torch.py runs transformers' Kimi-K2.5 tower on the same grids.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/cuda_check.h"
#include "engine/sequence_runner.h"
#include "kernels/random.h"
#include "models/loading.h"
#include "models/moonvit.h"
#include "vision/image.h"

using namespace atom;

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, load = "dummy";
  std::vector<int> sizes = {448, 1024};
  int text = 32, reps = 6, ttft = 1;
  std::vector<std::string> backends = {"flash", "gemm"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--model")
      model_dir = next();
    else if (a == "--load-format")
      load = next();
    else if (a == "--sizes")
      sizes = bench::int_list(next());
    else if (a == "--text")
      text = std::atoi(next().c_str());
    else if (a == "--reps")
      reps = std::max(2, std::atoi(next().c_str()));
    else if (a == "--ttft")
      ttft = std::atoi(next().c_str());
    else if (a == "--backends") {
      backends.clear();
      std::string l = next();
      for (size_t p = 0; p <= l.size();) {
        const size_t q = std::min(l.find(',', p), l.size());
        if (q > p) backends.push_back(l.substr(p, q - p));
        p = q + 1;
      }
    }
  }
  if (model_dir.empty()) {
    std::fprintf(stderr, "usage: cuda_vision_bench --model DIR [--sizes 448,1024] [--text 32]\n");
    return 2;
  }
  try {
    ::setenv("ATOM_VISION_CUDA", "1", 1);  // the tower on the GPU
    ModelOptions mo;
    mo.device = Device::cuda(0);
    LoadedModel lm = model_load(model_dir, mo, load_format_parse(load));
    Model& model = *lm.model;
    auto* tower = dynamic_cast<MoonVit*>(model.vision_encoder());
    ATOM_CHECK(tower != nullptr, "{}: the model has no MoonViT tower", model_dir);
    const MoonVitConfig& vc = tower->config();
    std::printf(
        "%s: tower %lld blocks, width %lld, %lld heads of %lld, mlp %lld, text width %lld\n",
        model_dir.c_str(), static_cast<long long>(vc.layers), static_cast<long long>(vc.hidden),
        static_cast<long long>(vc.heads), static_cast<long long>(vc.head_dim()),
        static_cast<long long>(vc.intermediate), static_cast<long long>(vc.text_hidden));
    std::printf("\n%-34s %10s %10s %12s %10s %10s\n", "case", "patches", "time", "images/s",
                "% matmul", "first");
    // Both attention paths (kernels/encoder.h), then the default for the time to first token.
    for (const std::string& backend : backends)
      for (int size : sizes) {
        ::setenv("ATOM_ENCODER_ATTENTION", backend.c_str(), 1);
        const vision::ImageGrid g = vision::image_grid(size, size, vision::ProcessorParams{});
        const int64_t P = g.num_patches();
        Tensor pix = Tensor::empty({P, 3, vc.patch_size, vc.patch_size}, DType::kF32);
        kernels::fill_uniform(pix, 7 + size, -1.0f, 1.0f);
        const std::vector<vision::ImageGrid> grids{g};
        std::vector<double> ts;
        for (int rep = 0; rep < reps; ++rep) {
          const double a = now();
          const Tensor f = tower->encode(pix, grids);
          ts.push_back(now() - a);
        }
        const double first = ts[0];  // a new size: its positional tables built on the host
        std::sort(ts.begin() + 1, ts.end());
        const double t = ts[(ts.size() + 1) / 2];  // the median of those after the first
        const double D = static_cast<double>(vc.hidden), Q = static_cast<double>(vc.qkv_hidden),
                     I = static_cast<double>(vc.intermediate), p = static_cast<double>(P);
        const double tokens = static_cast<double>(tower->tokens_for(g));
        // Per block: wqkv, wo, fc0, fc1 and attention (QKᵀ and PV over all pairs); the patch
        // embedding; the projector's two linears.
        const double flops =
            static_cast<double>(vc.layers) *
                (2.0 * p * (D * 3 * Q + Q * D + 2 * D * I) + 4.0 * p * p * Q) +
            2.0 * p * D * static_cast<double>(vc.patch_values()) +
            2.0 * tokens * (16 * D * D + 4 * D * static_cast<double>(vc.text_hidden));
        std::printf(
            "%-34s %10lld %7.2f ms %12.1f %9.1f%% %7.2f ms\n",
            fmt::format("tower {} {}x{} ({}x{} patches)", backend, size, size, g.h, g.w).c_str(),
            static_cast<long long>(P), t * 1e3, 1.0 / t, 100.0 * flops / bench::kMatmul / t,
            first * 1e3);
        std::fflush(stdout);
      }
    // Time to first token: one image of each size and `text` tokens around it.
    ::unsetenv("ATOM_ENCODER_ATTENTION");
    for (int size : ttft ? sizes : std::vector<int>{}) {
      const vision::ImageGrid g = vision::image_grid(size, size, vision::ProcessorParams{});
      const int64_t P = g.num_patches(), n = tower->tokens_for(g);
      Tensor pix = Tensor::empty({P, 3, vc.patch_size, vc.patch_size}, DType::kF32);
      kernels::fill_uniform(pix, 11 + size, -1.0f, 1.0f);
      const int vocab = static_cast<int>(model.config().vocab_size);
      std::vector<int32_t> ids;
      for (int i = 0; i < text / 2; ++i) ids.push_back((i * 7919 + 3) % vocab);
      const int64_t at = static_cast<int64_t>(ids.size());
      ids.insert(ids.end(), static_cast<size_t>(n), static_cast<int32_t>(tower->image_token_id()));
      for (int i = 0; i < text - text / 2; ++i) ids.push_back((i * 104729 + 5) % vocab);
      std::vector<double> ts, tt;
      for (int rep = 0; rep < 4; ++rep) {
        const double a = now();
        const Tensor f = tower->encode(pix, {g});
        const double b = now();
        InputEmbeds e;
        e.runs.push_back({at, f});
        const GreedyResult r = generate_greedy(model, ids, 1, {}, true, 16, std::nullopt, &e);
        CUDA_CHECK(cudaDeviceSynchronize());
        ts.push_back(now() - a);
        tt.push_back(b - a);
        (void)r;
      }
      std::sort(ts.begin() + 1, ts.end());
      std::sort(tt.begin() + 1, tt.end());
      std::printf("%-34s %10lld %7.2f ms   (tower %.2f ms, prompt %zu tokens)\n",
                  fmt::format("TTFT one {}x{} image + {} text", size, size, text).c_str(),
                  static_cast<long long>(n), ts[2] * 1e3, tt[2] * 1e3, ids.size());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_vision_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
