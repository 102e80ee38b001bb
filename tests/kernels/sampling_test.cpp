// CUDA argmax and seeded sampling against the CPU reference (itself checked against an independent
// derivation of the scheme): exact token ids.
#include "kernels/sampling.h"

#include <cmath>
#include <cstring>
#include <random>

#include "common/sampling_reference.h"
#include "gpu_util.h"

namespace atom::test {
namespace {

Tensor logits_cpu(int64_t rows, int64_t vocab, uint64_t seed) {
  Tensor t = random_cpu({rows, vocab}, DType::kF32, seed, -8, 8);
  // Ties on the maximum: the first index must win.
  for (int64_t r = 0; r < rows; r += 3) {
    t.ptr<float>()[r * vocab + 5] = 100.0f;
    t.ptr<float>()[r * vocab + vocab - 2] = 100.0f;
  }
  return t;
}

std::vector<int32_t> ids_of(const Tensor& t) {
  Tensor h = host(t);
  return std::vector<int32_t>(h.ptr<int32_t>(), h.ptr<int32_t>() + h.numel());
}

TEST(GpuSampling, ArgmaxExact) {
  for (int64_t V : {128256, 1000, 7}) {
    Tensor l = logits_cpu(33, V, static_cast<uint64_t>(V));
    Tensor ref = Tensor::empty({33}, DType::kI32);
    kernels::argmax(ref, l);
    Tensor out = Tensor::empty({33}, DType::kI32, gpu());
    poison(out);
    kernels::argmax(out, l.to(gpu()));
    EXPECT_EQ(ids_of(out), ids_of(ref)) << V;
  }
}

TEST(GpuSampling, SeededSamplingMatchesCpuAndRespectsFilters) {
  const int64_t R = 48, V = 5003;
  Tensor l = random_cpu({R, V}, DType::kF32, 77, -6, 6);
  std::vector<kernels::SamplingRow> rows(R);
  std::mt19937 rng(1);
  for (int64_t r = 0; r < R; ++r) {
    auto& p = rows[r];
    p.temperature = r % 8 == 0 ? 0.0f : 0.3f + 0.1f * static_cast<float>(r % 9);
    p.top_k = r % 3 == 0 ? 0 : static_cast<int32_t>(1 + r * 7 % 50);
    p.top_p = r % 4 == 1 ? 1.0f : 0.5f + 0.01f * static_cast<float>(r);
    p.min_p = r % 5 == 2 ? 0.05f : 0.0f;
    p.seed = rng();
    p.step = static_cast<uint64_t>(r * 13);
  }
  Tensor crow = kernels::sampling_rows_tensor(rows);
  Tensor ref = Tensor::empty({R}, DType::kI32);
  kernels::sample(ref, l, crow);
  Tensor out = Tensor::empty({R}, DType::kI32, gpu());
  poison(out);
  kernels::sample(out, l.to(gpu()), crow.to(gpu()));
  const auto got = ids_of(out), want = ids_of(ref);
  EXPECT_EQ(got, want);
  // And both are the scheme: the independent derivation (common/sampling_reference.h) per row.
  for (int64_t r = 0; r < R; ++r) {
    RefSamplingParams q;
    q.temperature = rows[r].temperature;
    q.top_p = rows[r].top_p;
    q.min_p = rows[r].min_p;
    q.top_k = rows[r].top_k;
    q.seed = rows[r].seed;
    q.step = rows[r].step;
    EXPECT_EQ(want[r], reference_sample(l.ptr<float>() + r * V, V, q)) << "row " << r;
  }
  // Filters hold: a top-k row's token is among its k largest logits.
  for (int64_t r = 0; r < R; ++r) {
    if (rows[r].temperature == 0.0f || rows[r].top_k <= 0) continue;
    const float* x = l.ptr<float>() + r * V;
    int64_t larger = 0;
    for (int64_t i = 0; i < V; ++i) larger += x[i] > x[got[r]];
    EXPECT_LT(larger, rows[r].top_k) << "row " << r;
  }
  // A row's token does not depend on its neighbours: sample row 7 alone.
  Tensor one = Tensor::empty({1}, DType::kI32, gpu());
  Tensor l7 = l.narrow(0, 7, 1).contiguous().to(gpu());
  Tensor r7 = kernels::sampling_rows_tensor({rows[7]}).to(gpu());
  kernels::sample(one, l7, r7);
  EXPECT_EQ(ids_of(one)[0], got[7]);
}

// Structured output's mask on the GPU against the CPU reference: bit-identical logits, at a real
// vocabulary size (151,936: not a multiple of the kernel's tile) and a small one.
TEST(GpuSampling, MaskLogitsMatchesCpu) {
  for (int64_t V : {151936, 1000}) {
    const int64_t R = 9, W = (V + 63) / 64, M = 4;
    Tensor l = random_cpu({R, V}, DType::kF32, static_cast<uint64_t>(V), -6, 6);
    Tensor masks = Tensor::empty({M, W}, DType::kU64);
    std::mt19937_64 rng(3);
    for (int64_t i = 0; i < M * W; ++i) masks.ptr<uint64_t>()[i] = rng() & rng();
    Tensor index = Tensor::empty({R}, DType::kI32);
    for (int64_t r = 0; r < R; ++r)
      index.ptr<int32_t>()[r] = r % 3 == 1 ? -1 : static_cast<int32_t>(r % M);
    Tensor g = l.to(gpu());
    kernels::mask_logits(g, masks.to(gpu()), index.to(gpu()));
    kernels::mask_logits(l, masks, index);
    Tensor h = host(g);
    EXPECT_EQ(std::memcmp(h.data(), l.data(), l.nbytes()), 0) << V;
    int64_t cleared = 0;
    for (int64_t i = 0; i < R * V; ++i) cleared += std::isinf(l.ptr<float>()[i]);
    EXPECT_GT(cleared, R * V / 3) << V;
  }
}

}  // namespace
}  // namespace atom::test
