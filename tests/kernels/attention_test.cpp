// CUDA paged attention (flash kernel, split-context decode, simple kernel) against the CPU
// reference on ragged batches over shuffled pages.
#include "kernels/attention.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <span>

#include "gpu_util.h"
#include "kernels/cuda_tuning.h"

namespace atom::test {
namespace {

struct SeqShape {
  int query, context;  // new tokens, tokens in the cache after this step
};

struct AttnCase {
  int heads, kv_heads, head_dim, block_size;
  std::vector<SeqShape> seqs;
  int window = 0;
  bool sinks = false;
  float softcap = 0.0f;
  DType dt = DType::kBF16;
  bool workspace = true;
  int context_bound = 0;  // > 0: max_context_len passed as this upper bound (as CUDA graphs do)
  // FP8 (e4m3) caches: random keys and values quantised by the CPU cache write (with these
  // scales); every_code: random e4m3 codes instead (every finite code, subnormals and +-448 too),
  // with small queries so the logits stay moderate.
  bool fp8 = false;
  kernels::KvScales scales = {};
  bool every_code = false;
  bool causal = true;  // false: every query sees its whole context (AttentionArgs::causal)
};

std::string describe(const AttnCase& c) {
  std::string s = fmt::format(
      "H{}/{} D{} bs{} w{}{}{}{} seqs", c.heads, c.kv_heads, c.head_dim, c.block_size, c.window,
      c.sinks ? " sinks" : "", c.softcap > 0 ? " softcap" : "",
      c.fp8
          ? fmt::format(" fp8 k{} v{}{}", c.scales.k, c.scales.v, c.every_code ? " every code" : "")
          : "");
  for (const auto& q : c.seqs) s += fmt::format(" {}/{}", q.query, q.context);
  if (!c.causal) s += " non-causal";
  return s;
}

void check_attention(const AttnCase& c, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> qs = {0}, cl, pip = {0}, pid;
  int total_pages = 0, max_q = 0, max_c = 0;
  for (const auto& s : c.seqs) {
    qs.push_back(qs.back() + s.query);
    cl.push_back(s.context);
    const int pages = (s.context + c.block_size - 1) / c.block_size;
    total_pages += pages;
    pip.push_back(pip.back() + pages);
    max_q = std::max(max_q, s.query);
    max_c = std::max(max_c, s.context);
  }
  const int num_pages = total_pages + 3;
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  pid.assign(perm.begin(), perm.begin() + total_pages);
  const int64_t T = qs.back();
  const int64_t qw = static_cast<int64_t>(c.heads) * c.head_dim;
  // q is a slice of a wider (qkv-like) row: strided.
  const float qr = c.every_code ? 4e-3f : 2.0f;
  Tensor qkv = random_cpu({T, qw + 64}, c.dt, seed + 1, -qr, qr);
  Tensor q = qkv.narrow(1, 0, qw);
  Tensor kc = random_cpu({num_pages, c.block_size, c.kv_heads, c.head_dim}, c.dt, seed + 2, -2, 2);
  Tensor vc = random_cpu({num_pages, c.block_size, c.kv_heads, c.head_dim}, c.dt, seed + 3, -2, 2);
  if (c.fp8) {
    const int64_t slots = static_cast<int64_t>(num_pages) * c.block_size;
    const int64_t width = static_cast<int64_t>(c.kv_heads) * c.head_dim;
    Tensor k8 = Tensor::empty(kc.shape(), DType::kF8E4M3),
           v8 = Tensor::empty(kc.shape(), DType::kF8E4M3);
    if (c.every_code) {
      for (int64_t i = 0; i < k8.numel(); ++i) {
        uint8_t b = static_cast<uint8_t>(rng()), d = static_cast<uint8_t>(rng());
        k8.ptr<uint8_t>()[i] = (b & 0x7f) == 0x7f ? 0x00 : b;  // NaN codes never stored
        v8.ptr<uint8_t>()[i] = (d & 0x7f) == 0x7f ? 0x80 : d;
      }
    } else {
      std::vector<int32_t> all(slots);
      std::iota(all.begin(), all.end(), 0);
      kernels::kv_cache_write(k8, v8, kc.view({slots, width}), vc.view({slots, width}), i32(all),
                              c.scales);
    }
    kc = k8;
    vc = v8;
  }
  Tensor sinks = c.sinks ? random_cpu({c.heads}, DType::kF32, seed + 4, -1, 3) : Tensor();
  kernels::AttentionArgs a;
  a.num_heads = c.heads;
  a.num_kv_heads = c.kv_heads;
  a.head_dim = c.head_dim;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  a.sliding_window = c.window;
  a.logit_softcap = c.softcap;
  a.max_query_len = max_q;
  a.max_context_len = c.context_bound > 0 ? c.context_bound : max_c;
  a.kv_scales = c.scales;
  a.causal = c.causal;
  Tensor cqs = i32(qs), ccl = i32(cl), cpip = i32(pip), cpid = i32(pid);
  kernels::AttentionBatch cb{&cqs, &ccl, &cpip, &cpid};
  Tensor ref = Tensor::empty({T, qw}, c.dt);
  kernels::paged_attention(ref, q, kc, vc, cb, sinks, a);

  Tensor gqs = cqs.to(gpu()), gcl = ccl.to(gpu()), gpip = cpip.to(gpu()), gpid = cpid.to(gpu());
  Tensor ws;
  kernels::AttentionBatch gb{&gqs, &gcl, &gpip, &gpid};
  const int64_t need = kernels::paged_attention_workspace_size(gpu(), T, a, c.dt);
  if (c.workspace && need > 0) {
    ws = Tensor::empty({need}, DType::kF32, gpu());
    poison(ws);
    gb.workspace = &ws;
  }
  Tensor out = Tensor::empty({T, qw}, c.dt, gpu());
  poison(out);
  Tensor gq = qkv.to(gpu()).narrow(1, 0, qw);
  kernels::paged_attention(out, gq, kc.to(gpu()), vc.to(gpu()), gb,
                           c.sinks ? sinks.to(gpu()) : Tensor(), a);
  // Against the CPU over the same (FP8 or not) cache: FP32 math, or BF16/F16 operands.
  const double tol = c.dt == DType::kF32 ? 1e-5 : 5e-3;
  EXPECT_LE(rel_err(out, ref), tol)
      << describe(c) << (need > 0 && c.workspace ? " (split)" : "") << " backend "
      << static_cast<int>(kernels::cuda::cuda_tuning().attention_backend);
}

// Every case on the default prefill backend (wgmma where it applies) and on mma.sync, case i with
// seed seed0 + 10 (i + 1).
void check_on_prefill_backends(std::span<const AttnCase> cases, uint64_t seed0) {
  using kernels::cuda::PrefillAttention;
  for (PrefillAttention b : {PrefillAttention::kAuto, PrefillAttention::kMma}) {
    const kernels::cuda::CudaTuningScope s(kernels::cuda::cuda_tuning_with(
        [&](kernels::cuda::CudaTuning& t) { t.attention_backend = b; }));
    uint64_t seed = seed0;
    for (const AttnCase& c : cases) check_attention(c, seed += 10);
  }
}

// Non-causal attention (the vision encoders' flash path): every query over its whole context, on
// the wgmma and mma.sync prefill kernels, decode mode, the simple kernel (head_dim 96, F32) and
// an FP8 cache, against the CPU's non-causal reference.
TEST(GpuAttention, NonCausalOnEveryKernel) {
  std::vector<AttnCase> cases = {
      {16, 16, 128, 1, {{300, 300}, {17, 17}, {129, 129}}},
      {16, 16, 64, 16, {{200, 333}, {1, 64}, {5, 9}}},
      {8, 8, 64, 16, {{12, 12}, {3, 40}}},  // decode mode: rows * group <= 16
      {4, 4, 96, 16, {{70, 70}, {1, 30}}},  // the simple kernel
      {4, 4, 64, 16, {{50, 80}}, 0, false, 0.0f, DType::kF32},
      {8, 8, 128, 16, {{150, 150}}, 0, false, 0.0f, DType::kBF16, true, 0, true, {0.5f, 0.25f}},
  };
  for (AttnCase& c : cases) c.causal = false;
  check_on_prefill_backends(cases, 5000);
}

TEST(GpuAttention, PrefillChunkedAndDecodeRagged) {
  const AttnCase cases[] = {
      // Prefill of several lengths, none a tile multiple; GQA 4.
      {32, 8, 128, 16, {{300, 300}, {17, 17}, {129, 129}}},
      // Chunked / prefix-cached prefill (context > query) and decode rows in one batch.
      {32, 8, 128, 16, {{70, 250}, {1, 999}, {1, 3}, {40, 40}, {0, 12}}},
      {16, 16, 64, 16, {{200, 333}, {1, 64}}},
      {8, 1, 256, 16, {{90, 130}, {1, 257}}},
      {64, 8, 64, 4, {{150, 150}}},
      {16, 16, 64, 16, {{260, 260}, {5, 300}}},
      // Sliding window, sinks, soft-cap.
      {32, 8, 128, 16, {{260, 300}, {1, 500}}, 37, true},
      {8, 2, 64, 16, {{100, 100}}, 0, false, 30.0f},
      {4, 1, 128, 8, {{65, 70}}, 16, false},
      {32, 8, 128, 16, {{400, 400}}, 150, true, 20.0f},
      // F16.
      {16, 4, 128, 16, {{140, 200}, {1, 77}}, 0, false, 0.0f, DType::kF16},
      {8, 8, 64, 16, {{190, 190}}, 0, true, 0.0f, DType::kF16},
  };
  check_on_prefill_backends(cases, 1000);
  using kernels::cuda::cuda_tuning_with;
  using kernels::cuda::CudaTuning;
  using kernels::cuda::CudaTuningScope;
  using kernels::cuda::PrefillAttention;
  {
    const CudaTuningScope s(cuda_tuning_with([](CudaTuning& t) { t.wgmma_warpgroups = 1; }));
    for (size_t i = 0; i < std::size(cases); ++i) check_attention(cases[i], 1400 + 10 * i);
  }
  // The wgmma kernel's other K/V pipelines (the default, 6, ran above): serial, two and three
  // stages, warp-specialized without and with ping-pong (one row tile per CTA), and the serial
  // loop with one warpgroup.
  for (int pipe : {0, 2, 3, 4, 5}) {
    const CudaTuningScope s(cuda_tuning_with([&](CudaTuning& t) { t.wgmma_pipeline = pipe; }));
    for (size_t i = 0; i < std::size(cases); ++i) check_attention(cases[i], 1600 + 10 * i + pipe);
  }
  // Pipeline 5 with its CTAs in either order (these grids are short enough for the order across
  // (sequence, kv head)s by default; the order within is what long prompts use).
  for (int order : {0, 1}) {
    const CudaTuningScope s(cuda_tuning_with([&](CudaTuning& t) {
      t.wgmma_pipeline = 5;
      t.wgmma_order_across = order;
    }));
    for (size_t i = 0; i < std::size(cases); ++i) check_attention(cases[i], 1800 + 10 * i + order);
  }
  // Warp-specialized: enough key tiles to cycle its K and V stages many times; one warpgroup
  // falls back to pipeline 2.
  for (int pipe : {4, 5, 6}) {
    const CudaTuningScope s(cuda_tuning_with([&](CudaTuning& t) { t.wgmma_pipeline = pipe; }));
    check_attention({8, 2, 128, 16, {{1100, 1100}, {37, 900}}, 0, true}, 1660 + pipe);
    check_attention({16, 16, 64, 16, {{1000, 1000}}, 300}, 1670 + pipe);
    const CudaTuningScope one(cuda_tuning_with([](CudaTuning& t) { t.wgmma_warpgroups = 1; }));
    check_attention(cases[0], 1680 + pipe);
  }
  {
    const CudaTuningScope s(cuda_tuning_with([](CudaTuning& t) {
      t.wgmma_warpgroups = 1;
      t.wgmma_pipeline = 0;
    }));
    for (size_t i = 0; i < std::size(cases); ++i) check_attention(cases[i], 1700 + 10 * i);
  }
  const CudaTuningScope s(cuda_tuning_with([](CudaTuning& t) {
    t.attention_m_atoms = 1;
    t.attention_backend = PrefillAttention::kMma;
  }));
  check_attention(cases[0], 1500);
  check_attention(cases[5], 1510);
}

// Decode-mode shapes, for the BF16/F16 and the FP8 cache tests.
std::vector<AttnCase> decode_mode_cases() {
  return {
      // Decode rows per kv head: G = 4, 8, 16 (the 16-row tile), 32 (beyond it: prefill mode).
      {32, 8, 128, 16, {{1, 700}, {1, 33}, {1, 64}, {1, 65}}},
      {64, 8, 128, 16, {{1, 1500}, {1, 1}}},
      {16, 1, 64, 16, {{1, 300}, {1, 2000}}},
      {32, 1, 128, 16, {{1, 900}, {1, 17}}},
      // Several new tokens per sequence within the 16 rows (speculative decoding); head_dim 256
      // with sinks; a window and small pages.
      {32, 8, 128, 16, {{4, 300}, {2, 2}, {3, 1200}}},
      {16, 8, 256, 16, {{8, 520}, {1, 40}}, 0, true},
      {32, 8, 64, 4, {{1, 333}, {1, 4096}}, 100, true},
  };
}

TEST(GpuAttention, DecodeModeGroupsAndShortQueries) {
  const std::vector<AttnCase> cases = decode_mode_cases();
  uint64_t seed = 5000;
  for (const AttnCase& c : cases) check_attention(c, seed += 10);
  // A context bound far above the real lengths, as a captured decode graph passes: every
  // sequence still splits only as far as its own length allows.
  for (AttnCase c : cases) {
    c.context_bound = 8192;
    check_attention(c, seed += 10);
  }
}

TEST(GpuAttention, SplitContextDecodeWithAndWithoutWorkspace) {
  // Few sequences with long contexts: the context is split across CTAs (flash-decoding).
  AttnCase c{32, 8, 128, 16, {{1, 3000}, {1, 4097}, {1, 100}}};
  check_attention(c, 2000);
  c.sinks = true;
  check_attention(c, 2010);
  c.window = 1000;
  check_attention(c, 2020);
  c.workspace = false;
  check_attention(c, 2030);
  AttnCase d{8, 8, 64, 16, {{1, 5000}}};
  check_attention(d, 2040);
  // The same splits merged by the separate combine kernel.
  AttnCase e{32, 8, 128, 16, {{1, 3000}, {1, 4097}, {1, 100}}, 0, true};
  {
    const kernels::cuda::CudaTuningScope s(kernels::cuda::cuda_tuning_with(
        [](kernels::cuda::CudaTuning& t) { t.attention_merge_in_kernel = false; }));
    check_attention(e, 2050);
    check_attention(d, 2060);
  }
  // Repeated launches reuse the split tickets: each launch must leave them zeroed.
  for (int i = 0; i < 3; ++i) check_attention(e, 2070 + i);
  // Splits of one tile (short contexts split too: 100 keys in two splits, a tile and a part
  // tile) and of sixteen, merged in the kernel and by the combine kernel, BF16 and FP8 caches,
  // under a captured graph's context bound.
  for (const int tiles : {1, 16}) {
    for (const bool in_kernel : {true, false}) {
      const kernels::cuda::CudaTuningScope s(
          kernels::cuda::cuda_tuning_with([&](kernels::cuda::CudaTuning& t) {
            t.attention_split_min_tiles = tiles;
            t.attention_merge_in_kernel = in_kernel;
          }));
      AttnCase f{32, 4, 128, 16, {{1, 100}, {1, 190}, {1, 3000}, {1, 64}}, 0, true};
      f.context_bound = 8192;
      check_attention(f, 2100 + tiles + in_kernel);
      f.fp8 = true;
      check_attention(f, 2200 + tiles + in_kernel);
    }
  }
}

TEST(GpuAttention, SimpleKernelForOtherHeadSizesAndF32) {
  const AttnCase cases[] = {
      {8, 2, 32, 16, {{40, 40}, {1, 20}}},
      {4, 4, 80, 16, {{33, 50}}, 9, true},
      {8, 2, 16, 4, {{21, 21}}, 0, false, 0.0f, DType::kF32},
      {4, 2, 128, 16, {{50, 70}, {1, 33}}, 0, true, 0.0f, DType::kF32},
  };
  uint64_t seed = 3000;
  for (const AttnCase& c : cases) check_attention(c, seed += 10);
  // The simple kernel on shapes the tensor-core kernels would take.
  const kernels::cuda::CudaTuningScope s(
      kernels::cuda::cuda_tuning_with([](kernels::cuda::CudaTuning& t) {
        t.attention_backend = kernels::cuda::PrefillAttention::kSimple;
      }));
  check_attention({32, 8, 128, 16, {{70, 250}, {1, 999}}, 37, true}, 3100);
}

// FP8 caches on every path, against the CPU reference over the same e4m3 cache.
std::vector<AttnCase> fp8_cases(std::vector<AttnCase> cs, kernels::KvScales scales = {}) {
  for (auto& c : cs) {
    c.fp8 = true;
    c.scales = scales;
  }
  return cs;
}

TEST(GpuAttention, Fp8CachePrefillPaths) {
  const std::vector<AttnCase> base = {
      // Prefill of several lengths, chunked / prefix-cached prefill with decode rows in one batch.
      {32, 8, 128, 16, {{300, 300}, {17, 17}, {129, 129}}},
      {32, 8, 128, 16, {{70, 250}, {1, 999}, {1, 3}, {40, 40}, {0, 12}}},
      {16, 16, 64, 16, {{200, 333}, {1, 64}}},
      {8, 1, 256, 16, {{90, 130}, {1, 257}}},
      {64, 8, 64, 4, {{150, 150}}},
      // Sliding window, sinks, soft-cap; F16 activations.
      {32, 8, 128, 16, {{260, 300}, {1, 500}}, 37, true},
      {8, 2, 64, 16, {{100, 100}}, 0, false, 30.0f},
      {32, 8, 128, 16, {{400, 400}}, 150, true, 20.0f},
      {16, 4, 128, 16, {{140, 200}, {1, 77}}, 0, false, 0.0f, DType::kF16},
      {8, 8, 64, 16, {{190, 190}}, 0, true, 0.0f, DType::kF16},
  };
  using kernels::cuda::PrefillAttention;
  for (PrefillAttention b :
       {PrefillAttention::kAuto, PrefillAttention::kMma, PrefillAttention::kSimple}) {
    const kernels::cuda::CudaTuningScope s(kernels::cuda::cuda_tuning_with(
        [&](kernels::cuda::CudaTuning& t) { t.attention_backend = b; }));
    uint64_t seed = 7000;
    for (const AttnCase& c : fp8_cases(base)) check_attention(c, seed += 10);
    for (const AttnCase& c : fp8_cases(base, {0.05f, 4.0f})) check_attention(c, seed += 10);
  }
  // The one-warpgroup wgmma setting leaves FP8 prefill on two warpgroups.
  {
    const kernels::cuda::CudaTuningScope s(kernels::cuda::cuda_tuning_with(
        [](kernels::cuda::CudaTuning& t) { t.wgmma_warpgroups = 1; }));
    check_attention(fp8_cases(base)[0], 7500);
  }
  // Every e4m3 code, on the wgmma (d128, d64) and mma.sync (d256) paths.
  for (AttnCase c : fp8_cases({base[0], base[2], base[3]})) {
    c.every_code = true;
    check_attention(c, 7600 + c.head_dim);
  }
}

TEST(GpuAttention, Fp8CacheDecodeSplitsAndMerges) {
  std::vector<AttnCase> base = decode_mode_cases();
  // Few long sequences: split across CTAs (flash-decoding); soft-cap; F16.
  base.insert(base.end(), {{32, 8, 128, 16, {{1, 3000}, {1, 4097}, {1, 100}}, 0, true},
                           {32, 8, 128, 16, {{1, 3000}, {1, 4097}, {1, 100}}, 1000, true, 25.0f},
                           {8, 8, 64, 16, {{1, 5000}}},
                           {16, 2, 256, 16, {{1, 2500}, {1, 700}}, 0, false, 0.0f, DType::kF16}});
  uint64_t seed = 8000;
  for (const AttnCase& c : fp8_cases(base)) check_attention(c, seed += 10);
  for (AttnCase c : fp8_cases(base, {2.5f, 0.3f})) {
    c.context_bound = 8192;  // a captured graph's bound: splits by each sequence's own length
    check_attention(c, seed += 10);
  }
  // Without workspace (no split), and merged by the separate combine kernel.
  for (AttnCase c : fp8_cases({base[7], base[9]})) {
    c.workspace = false;
    check_attention(c, seed += 10);
  }
  {
    const kernels::cuda::CudaTuningScope s(kernels::cuda::cuda_tuning_with(
        [](kernels::cuda::CudaTuning& t) { t.attention_merge_in_kernel = false; }));
    for (const AttnCase& c : fp8_cases({base[7], base[9], base[10]}, {0.5f, 2.0f}))
      check_attention(c, seed += 10);
  }
  // Repeated launches leave the split tickets zeroed; every e4m3 code through the decode kernel.
  for (int i = 0; i < 3; ++i) check_attention(fp8_cases({base[7]})[0], seed += 10);
  for (AttnCase c : fp8_cases({base[1], base[5], base[9]})) {
    c.every_code = true;
    check_attention(c, seed += 10);
  }
}

}  // namespace
}  // namespace atom::test
