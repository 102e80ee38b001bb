// Kernel benchmarks on the GPU, on Llama-3.1-8B shapes: each line prints time, achieved bytes/s
// and FLOP/s, and the fraction of the binding hardware limit (bench_util.h).
//   cuda_kernel_bench [gemm|attention|small|all]
// Inputs larger than L2 (weights, KV caches) are rotated or sized past the 50 MB L2.
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "bench_util.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/cuda_tuning.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/random.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"

using namespace atom;
using bench::report;
using bench::time_op;

namespace {

const Device kGpu = Device::cuda(0);

Tensor rnd(Shape s, DType dt, uint64_t seed, float lo = -1, float hi = 1) {
  Tensor t = Tensor::empty(std::move(s), dt, kGpu);
  kernels::fill_uniform(t, seed, lo, hi);
  return t;
}

Tensor i32_gpu(const std::vector<int32_t>& v) {
  Tensor h = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::memcpy(h.data(), v.data(), v.size() * 4);
  return h.to(kGpu);
}

void bench_gemm() {
  std::printf(
      "\n== GEMM (x [M, K] . w [N, K]^T, bf16, fp32 accumulate), Llama-3.1-8B projections\n");
  struct Shape2 {
    const char* name;
    int64_t n, k;
    DType out;
  };
  const Shape2 shapes[] = {{"qkv_proj", 6144, 4096, DType::kBF16},
                           {"o_proj", 4096, 4096, DType::kBF16},
                           {"gate_up_proj", 28672, 4096, DType::kBF16},
                           {"down_proj", 4096, 14336, DType::kBF16},
                           {"lm_head", 128256, 4096, DType::kF32}};
  for (const auto& s : shapes) {
    const double wbytes = static_cast<double>(s.n) * s.k * 2;
    // Enough weight copies to exceed L2 several times over.
    const int copies = static_cast<int>(std::max(1.0, std::ceil(400e6 / wbytes)));
    std::vector<Tensor> ws;
    for (int c = 0; c < copies; ++c)
      ws.push_back(rnd({s.n, s.k}, DType::kBF16, 10 + c, -0.02f, 0.02f));
    for (int64_t m : {1, 2, 4, 8, 32, 128, 512, 2048, 8192}) {
      if (s.out == DType::kF32 && m > 128) continue;  // prefill computes the last row's logits only
      Tensor x = rnd({m, s.k}, DType::kBF16, 5);
      Tensor y = Tensor::empty({m, s.n}, s.out, kGpu);
      const double bytes = wbytes + static_cast<double>(m) * s.k * 2 +
                           static_cast<double>(m) * s.n * (s.out == DType::kF32 ? 4 : 2);
      const double flops = 2.0 * m * s.n * s.k;
      for (int skinny : {4, 0}) {
        if (skinny == 4 && m > 4) continue;
        kernels::cuda::CudaTuning tuning = kernels::cuda::cuda_tuning();
        tuning.skinny_max_m = skinny;
        const kernels::cuda::CudaTuningScope scope(tuning);
        const int iters = m >= 2048 ? 5 : 20;
        const double t = time_op([&](int i) { kernels::linear(y, x, ws[i % copies]); }, iters);
        report(fmt::format("{} M={} N={} K={} {}", s.name, m, s.n, s.k,
                           m <= 4 ? (skinny ? "skinny" : "cublasLt") : "cublasLt"),
               t, bytes, flops);
      }
    }
  }
}

// Paged attention over a cache of shuffled 16-token pages. Prefill: every sequence attends over
// its own new tokens (causal). Decode: one new token over `context` cached tokens. fp8: the cache
// holds e4m3 codes (the BF16 values through kv_cache_write), and the bytes counted are 1 per
// element.
void bench_attention_case(const std::string& name, int seqs, int query, int context, int hq, int hk,
                          int d, int context_bound = 0, bool fp8 = false) {
  const int bs = 16;
  const int pages_per = (context + bs - 1) / bs;
  const int pages = seqs * pages_per;
  std::vector<int32_t> perm(pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(1));
  std::vector<int32_t> qs = {0}, cl, pip = {0};
  for (int s = 0; s < seqs; ++s) {
    qs.push_back(qs.back() + query);
    cl.push_back(context);
    pip.push_back(pip.back() + pages_per);
  }
  const int64_t T = qs.back();
  Tensor kc = rnd({pages, bs, hk, d}, DType::kBF16, 1),
         vc = rnd({pages, bs, hk, d}, DType::kBF16, 2);
  if (fp8) {
    const int64_t slots = static_cast<int64_t>(pages) * bs, width = static_cast<int64_t>(hk) * d;
    Tensor k8 = Tensor::empty({pages, bs, hk, d}, DType::kF8E4M3, kGpu);
    Tensor v8 = Tensor::empty({pages, bs, hk, d}, DType::kF8E4M3, kGpu);
    std::vector<int32_t> all(slots);
    std::iota(all.begin(), all.end(), 0);
    kernels::kv_cache_write(k8, v8, kc.view({slots, width}), vc.view({slots, width}), i32_gpu(all));
    kc = k8;
    vc = v8;
  }
  Tensor q = rnd({T, static_cast<int64_t>(hq) * d}, DType::kBF16, 3);
  Tensor out = Tensor::empty({T, static_cast<int64_t>(hq) * d}, DType::kBF16, kGpu);
  Tensor gqs = i32_gpu(qs), gcl = i32_gpu(cl), gpip = i32_gpu(pip), gpid = i32_gpu(perm);
  kernels::AttentionArgs a;
  a.num_heads = hq;
  a.num_kv_heads = hk;
  a.head_dim = d;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  a.max_query_len = query;
  a.max_context_len = context_bound > 0 ? context_bound : context;
  kernels::AttentionBatch b{&gqs, &gcl, &gpip, &gpid};
  Tensor ws;
  const int64_t need = kernels::paged_attention_workspace_size(kGpu, T, a, DType::kBF16);
  if (need > 0) {
    ws = Tensor::empty({need}, DType::kF32, kGpu);
    b.workspace = &ws;
  }
  const double t = time_op([&](int) { kernels::paged_attention(out, q, kc, vc, b, Tensor(), a); },
                           query > 1 ? 5 : 20);
  double flops, bytes;
  if (query == context) {  // causal prefill: the FlashAttention convention, 4 S^2 D H / 2
    flops = 4.0 * seqs * static_cast<double>(query) * query * d * hq / 2;
  } else {
    flops = 4.0 * seqs * static_cast<double>(query) * context * d * hq;
  }
  bytes = 2.0 * seqs * static_cast<double>(context) * hk * d * (fp8 ? 1 : 2) + 2.0 * T * hq * d * 2;
  report(fmt::format("{} ({} splits)", name, need > 0 ? need / (T * hq * (d + 2)) : 1), t, bytes,
         flops);
}

void bench_attention() {
  using kernels::cuda::PrefillAttention;
  std::printf("\n== Paged attention, bf16, 16-token pages (shuffled)\n");
  // wgmma: warpgroups per CTA and K/V pipeline (0 the serial loop, 2/3 overlapped, stages;
  // 4 warp-specialized, 5 with ping-pong, 6 with two row tiles per CTA: the default).
  struct Variant {
    PrefillAttention be;
    int warpgroups, pipeline;
    const char* tag;
  };
  const Variant variants[] = {
      {PrefillAttention::kAuto, 2, 6, "wgmma 2wg ping-pong, tile pairs (default)"},
      {PrefillAttention::kAuto, 2, 2, "wgmma 2wg"},
      {PrefillAttention::kAuto, 2, 4, "wgmma 2wg warp-specialized"},
      {PrefillAttention::kAuto, 2, 5, "wgmma 2wg warp-specialized ping-pong"},
      {PrefillAttention::kAuto, 2, 3, "wgmma 2wg 3-stage"},
      {PrefillAttention::kAuto, 2, 0, "wgmma 2wg serial"},
      {PrefillAttention::kAuto, 1, 2, "wgmma 1wg"},
      {PrefillAttention::kAuto, 1, 0, "wgmma 1wg serial"},
      {PrefillAttention::kMma, 2, 2, "mma.sync"},
  };
  // ATOM_BENCH_PIPELINES=5,6,5: only the two-warpgroup wgmma rows of those pipelines, in that
  // order (repeats allowed, to see the GPU's clocks drift); default every variant.
  std::vector<const Variant*> order;
  if (const char* list = std::getenv("ATOM_BENCH_PIPELINES")) {
    for (const int pipe : bench::int_list(list))
      for (const Variant& v : variants)
        if (v.be == PrefillAttention::kAuto && v.warpgroups == 2 && v.pipeline == pipe)
          order.push_back(&v);
  } else {
    for (const Variant& v : variants) order.push_back(&v);
  }
  for (const Variant* vp : order) {
    const Variant& v = *vp;
    kernels::cuda::CudaTuning tuning = kernels::cuda::cuda_tuning();
    tuning.attention_backend = v.be;
    tuning.wgmma_warpgroups = v.warpgroups;
    tuning.wgmma_pipeline = v.pipeline;
    const kernels::cuda::CudaTuningScope scope(tuning);
    const std::string tag = v.tag;
    bench_attention_case("prefill 1x4096 causal, 32/8 heads, d128 " + tag, 1, 4096, 4096, 32, 8,
                         128);
    bench_attention_case("prefill 4x2048 causal, 32/8 heads, d128 " + tag, 4, 2048, 2048, 32, 8,
                         128);
    bench_attention_case("prefill 1x8192 causal, 64/64 heads, d64 " + tag, 1, 8192, 8192, 64, 64,
                         64);
    bench_attention_case("prefill 1x2048 causal, 32/8 heads, d128 " + tag, 1, 2048, 2048, 32, 8,
                         128);
    bench_attention_case("prefill 1x8192 causal, 32/8 heads, d128 " + tag, 1, 8192, 8192, 32, 8,
                         128);
  }
  bench_attention_case("decode 64 x 4096 ctx, 32/8 heads, d128", 64, 1, 4096, 32, 8, 128);
  bench_attention_case("decode 128 x 1024 ctx, 32/8 heads, d128", 128, 1, 1024, 32, 8, 128);
  bench_attention_case("decode 32 x 4096 ctx, 32/8 heads, d128", 32, 1, 4096, 32, 8, 128);
  bench_attention_case("decode 1 x 32768 ctx, 32/8 heads, d128", 1, 1, 32768, 32, 8, 128);
  bench_attention_case("decode 1 x 4096 ctx, 32/8 heads, d128", 1, 1, 4096, 32, 8, 128);
  bench_attention_case("decode 8 x 8192 ctx, 32/8 heads, d128", 8, 1, 8192, 32, 8, 128);
  bench_attention_case("decode 1 x 200 ctx (bound 8192), 32/8, d128", 1, 1, 200, 32, 8, 128, 8192);
  bench_attention_case("decode 128 x 200 ctx (bound 8192), 32/8, d128", 128, 1, 200, 32, 8, 128,
                       8192);

  // FP8 (e4m3) KV cache: the same shapes; decode reads half the bytes (% of 4.29 TB/s counts
  // them), prefill converts tiles to BF16 in shared memory (wgmma) or FP16 in registers (mma).
  std::printf("\n== Paged attention, bf16 activations, fp8 e4m3 KV cache, 16-token pages\n");
  bench_attention_case("fp8 decode 64 x 4096 ctx, 32/8 heads, d128", 64, 1, 4096, 32, 8, 128, 0,
                       true);
  bench_attention_case("fp8 decode 128 x 1024 ctx, 32/8 heads, d128", 128, 1, 1024, 32, 8, 128, 0,
                       true);
  bench_attention_case("fp8 decode 256 x 1536 ctx, 32/8 heads, d128", 256, 1, 1536, 32, 8, 128, 0,
                       true);
  bench_attention_case("fp8 decode 32 x 4096 ctx, 32/8 heads, d128", 32, 1, 4096, 32, 8, 128, 0,
                       true);
  bench_attention_case("fp8 decode 1 x 32768 ctx, 32/8 heads, d128", 1, 1, 32768, 32, 8, 128, 0,
                       true);
  bench_attention_case("fp8 decode 1 x 4096 ctx, 32/8 heads, d128", 1, 1, 4096, 32, 8, 128, 0,
                       true);
  bench_attention_case("fp8 decode 8 x 8192 ctx, 32/8 heads, d128", 8, 1, 8192, 32, 8, 128, 0,
                       true);
  bench_attention_case("fp8 decode 128 x 200 ctx (bound 8192), 32/8, d128", 128, 1, 200, 32, 8, 128,
                       8192, true);
  bench_attention_case("bf16 decode 256 x 1536 ctx, 32/8 heads, d128", 256, 1, 1536, 32, 8, 128);
  for (const PrefillAttention be : {PrefillAttention::kAuto, PrefillAttention::kMma}) {
    kernels::cuda::CudaTuning tuning = kernels::cuda::cuda_tuning();
    tuning.attention_backend = be;
    const kernels::cuda::CudaTuningScope scope(tuning);
    const std::string tag = be == PrefillAttention::kAuto ? "wgmma" : "mma.sync";
    bench_attention_case("fp8 prefill 1x4096 causal, 32/8 heads, d128 " + tag, 1, 4096, 4096, 32, 8,
                         128, 0, true);
    bench_attention_case("fp8 prefill 1x8192 causal, 32/8 heads, d128 " + tag, 1, 8192, 8192, 32, 8,
                         128, 0, true);
    bench_attention_case("fp8 prefill 1x8192 causal, 64/64 heads, d64 " + tag, 1, 8192, 8192, 64,
                         64, 64, 0, true);
  }
}

void bench_small() {
  std::printf("\n== Memory-bound kernels, 8192 tokens (and 1 token: launch-bound)\n");
  const int64_t H = 4096, I = 14336;
  for (int64_t T : {8192, 1}) {
    Tensor x = rnd({T, H}, DType::kBF16, 1), res = rnd({T, H}, DType::kBF16, 2),
           w = rnd({H}, DType::kBF16, 3);
    Tensor out = Tensor::empty({T, H}, DType::kBF16, kGpu);
    double t = time_op([&](int) { kernels::rms_norm(out, x, &res, w, 1e-5f); });
    report(fmt::format("rms_norm + residual T={} H={}", T, H), t, 4.0 * T * H * 2, 0);
    Tensor gu = rnd({T, 2 * I}, DType::kBF16, 4);
    Tensor act = Tensor::empty({T, I}, DType::kBF16, kGpu);
    t = time_op([&](int) { kernels::silu_mul(act, gu); });
    report(fmt::format("silu_mul T={} I={}", T, I), t, 3.0 * T * I * 2, 0);
    Tensor qkv = rnd({T, 6144}, DType::kBF16, 5);
    Tensor q = qkv.narrow(1, 0, 4096), k = qkv.narrow(1, 4096, 1024);
    std::vector<int32_t> p(T);
    std::iota(p.begin(), p.end(), 0);
    Tensor pos = i32_gpu(p);
    Tensor inv = rnd({64}, DType::kF32, 6, 0.0f, 1.0f);
    kernels::RopeArgs ra{128, 128, 1.0f, false};
    t = time_op([&](int) { kernels::rope(q, k, pos, inv, ra); });
    report(fmt::format("rope q+k T={} 32+8 heads d128", T), t, 2.0 * T * 5120 * 2, 0);
    Tensor kc = Tensor::empty({(T + 15) / 16 + 1, 16, 8, 128}, DType::kBF16, kGpu);
    Tensor vc = Tensor::empty({(T + 15) / 16 + 1, 16, 8, 128}, DType::kBF16, kGpu);
    Tensor kk = qkv.narrow(1, 4096, 1024), vv = qkv.narrow(1, 5120, 1024);
    t = time_op([&](int) { kernels::kv_cache_write(kc, vc, kk, vv, pos); });
    report(fmt::format("kv_cache_write T={} 8 heads d128", T), t, 4.0 * T * 1024 * 2, 0);
    Tensor kc8 = Tensor::empty({(T + 15) / 16 + 1, 16, 8, 128}, DType::kF8E4M3, kGpu);
    Tensor vc8 = Tensor::empty({(T + 15) / 16 + 1, 16, 8, 128}, DType::kF8E4M3, kGpu);
    t = time_op([&](int) { kernels::kv_cache_write(kc8, vc8, kk, vv, pos); });
    report(fmt::format("kv_cache_write fp8 T={} 8 heads d128", T), t, 2.0 * T * 1024 * 3, 0);
    Tensor table = rnd({128256, H}, DType::kBF16, 7);
    std::vector<int32_t> ids(T);
    for (int64_t i = 0; i < T; ++i) ids[i] = static_cast<int32_t>((i * 7919) % 128256);
    Tensor gids = i32_gpu(ids);
    t = time_op([&](int) { kernels::embedding(out, gids, table, 0); });
    report(fmt::format("embedding T={} H={}", T, H), t, 2.0 * T * H * 2, 0);
  }
  for (int64_t R : {128, 1}) {
    Tensor logits = rnd({R, 128256}, DType::kF32, 8, -10, 10);
    Tensor ids = Tensor::empty({R}, DType::kI32, kGpu);
    double t = time_op([&](int) { kernels::argmax(ids, logits); });
    report(fmt::format("argmax {} x 128256 f32", R), t, 4.0 * R * 128256, 0);
    std::vector<kernels::SamplingRow> rows(R);
    for (int64_t r = 0; r < R; ++r) {
      rows[r].temperature = 0.8f;
      rows[r].top_k = 50;
      rows[r].top_p = 0.9f;
      rows[r].seed = static_cast<uint64_t>(r);
    }
    Tensor grows = kernels::sampling_rows_tensor(rows).to(kGpu);
    t = time_op([&](int) { kernels::sample(ids, logits, grows); }, 5);
    report(fmt::format("sample {} x 128256 (T 0.8, top-k 50, top-p 0.9)", R), t, 4.0 * R * 128256,
           0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "all";
  try {
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    std::printf("device: %s, %d SMs, L2 %d MB; limits: %.2f TB/s, %.0f TFLOP/s\n", p.name,
                p.multiProcessorCount, p.l2CacheSize >> 20, bench::kBandwidth / 1e12,
                bench::kMatmul / 1e12);
    if (what == "gemm" || what == "all") bench_gemm();
    if (what == "attention" || what == "all") bench_attention();
    if (what == "small" || what == "all") bench_small();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
