// CUDA encoder ops (kernels/encoder.h: the vision towers' attention, pair rotation, GELU and
// gathered mean) against the CPU reference, on the same inputs.
#include "kernels/encoder.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "gpu_util.h"

namespace atom::test {
namespace {

// A [rows, cols] view with rows `pad` elements longer than cols, random, on the host and on the
// GPU (the same values).
struct StridedPair {
  Tensor host_base, gpu_base, host, dev;
};
StridedPair strided_pair(int64_t rows, int64_t cols, int64_t pad, DType dt, uint64_t seed,
                         float lo = -1.0f, float hi = 1.0f) {
  StridedPair s;
  s.host_base = random_cpu({rows, cols + pad}, dt, seed, lo, hi);
  s.gpu_base = s.host_base.to(gpu());
  s.host = s.host_base.narrow(1, 0, cols);
  s.dev = s.gpu_base.narrow(1, 0, cols);
  return s;
}

struct EncoderAttnCase {
  std::vector<int64_t> lens;
  int heads, head_dim;
  DType dt;
  double tol;
};

using Backend = kernels::EncoderAttentionBackend;

// Each backend against the CPU on the same inputs: the flash kernels without the causal mask
// (heads padded to 64 or 128) and the cuBLAS GEMMs around a softmax.
TEST(GpuEncoder, AttentionOverVariableLengthSequences) {
  // F32 runs cuBLAS in F32 (no TF32); BF16/F16 round the probabilities before P V.
  const EncoderAttnCase cases[] = {
      {{37, 128, 5}, 4, 72, DType::kF32, 1e-5}, {{37, 128, 5}, 4, 72, DType::kBF16, 1e-2},
      {{1, 300}, 16, 64, DType::kBF16, 1e-2},   {{200, 3, 17}, 2, 80, DType::kF16, 5e-3},
      {{1000}, 16, 72, DType::kBF16, 1e-2},     {{9, 700}, 3, 128, DType::kBF16, 1e-2},
      {{7000}, 1, 64, DType::kBF16, 1e-2},  // 7000² · 6 bytes > 256 MiB: kGemm in query chunks
  };
  for (const EncoderAttnCase& c : cases) {
    std::vector<int64_t> starts{0};
    for (int64_t l : c.lens) starts.push_back(starts.back() + l);
    const int64_t T = starts.back(), Q = int64_t{c.heads} * c.head_dim;
    // Scores spread over several units so the softmax is not flat.
    StridedPair qkv = strided_pair(T, 3 * Q, 8, c.dt, 17 + T, -2.0f, 2.0f);
    kernels::EncoderAttention a{c.heads, c.head_dim,
                                1.0f / std::sqrt(static_cast<float>(c.head_dim))};
    Tensor want = Tensor::empty({T, Q}, c.dt);
    Arena host_arena(Device::cpu());
    kernels::encoder_attention(want, qkv.host, starts, a, host_arena);
    for (Backend b : {Backend::kFlash, Backend::kGemm}) {
      if (b == Backend::kFlash && c.dt == DType::kF32) continue;
      a.backend = b;
      Tensor got = Tensor::empty({T, Q}, c.dt, gpu());
      poison(got);
      Arena arena(gpu());
      kernels::encoder_attention(got, qkv.dev, starts, a, arena);
      CUDA_CHECK(cudaDeviceSynchronize());
      const char* name = b == Backend::kFlash ? "flash" : "gemm";
      const double e = rel_err(to_f32_cpu(got), to_f32_cpu(want), "encoder_attention");
      std::printf("encoder_attention %s T=%lld H=%d D=%d %s: rel err %.3g\n", name,
                  static_cast<long long>(T), c.heads, c.head_dim,
                  std::string(dtype_name(c.dt)).c_str(), e);
      EXPECT_LE(e, c.tol) << name << " T " << T << " heads " << c.heads << " head_dim "
                          << c.head_dim << " " << dtype_name(c.dt);
    }
  }
  // The flash path refuses what it cannot take when asked for by name.
  Tensor f32 = Tensor::zeros({4, 3 * 64}, DType::kF32, gpu()),
         o = Tensor::empty({4, 64}, DType::kF32, gpu());
  Arena arena(gpu());
  EXPECT_THROW(kernels::encoder_attention(o, f32, {0, 4}, {1, 64, 1.0f, Backend::kFlash}, arena),
               Error);
}

// The RoPE tables given to the attention (EncoderAttention::rope_cos/sin): on the flash path q and
// k are turned in the pass that pads the heads. Against the CPU (which turns them in place), and
// byte for byte against rotate_pairs() then the attention without tables on the GPU.
TEST(GpuEncoder, AttentionWithRopeTablesMatchesCpu) {
  const EncoderAttnCase cases[] = {
      {{37, 128, 5}, 4, 72, DType::kBF16, 1e-2},
      {{300}, 16, 64, DType::kBF16, 1e-2},
      {{200, 3, 17}, 2, 80, DType::kF16, 5e-3},
  };
  for (const EncoderAttnCase& c : cases) {
    std::vector<int64_t> starts{0};
    for (int64_t l : c.lens) starts.push_back(starts.back() + l);
    const int64_t T = starts.back(), Q = int64_t{c.heads} * c.head_dim, P = c.head_dim / 2;
    const StridedPair qkv = strided_pair(T, 3 * Q, 8, c.dt, 31 + T, -2.0f, 2.0f);
    const Tensor ang = random_cpu({T, P}, DType::kF32, 5 + T, -3.0f, 3.0f);
    Tensor cs = Tensor::empty({T, P}, DType::kF32), sn = Tensor::empty({T, P}, DType::kF32);
    for (int64_t i = 0; i < T * P; ++i) {
      cs.ptr<float>()[i] = std::cos(ang.ptr<float>()[i]);
      sn.ptr<float>()[i] = std::sin(ang.ptr<float>()[i]);
    }
    const Tensor gcs = cs.to(gpu()), gsn = sn.to(gpu());
    kernels::EncoderAttention a{c.heads, c.head_dim,
                                1.0f / std::sqrt(static_cast<float>(c.head_dim))};
    a.rope_cos = &cs;
    a.rope_sin = &sn;
    Tensor want = Tensor::empty({T, Q}, c.dt);
    Arena host_arena(Device::cpu());
    Tensor host_qkv = qkv.host.contiguous().clone();
    kernels::encoder_attention(want, host_qkv, starts, a, host_arena);
    a.rope_cos = &gcs;
    a.rope_sin = &gsn;
    for (Backend b : {Backend::kFlash, Backend::kGemm}) {
      a.backend = b;
      const Tensor base = qkv.gpu_base.clone();  // each run turns its own copy
      Tensor dev = base.narrow(1, 0, 3 * Q);
      Tensor got = Tensor::empty({T, Q}, c.dt, gpu());
      poison(got);
      Arena arena(gpu());
      kernels::encoder_attention(got, dev, starts, a, arena);
      const char* name = b == Backend::kFlash ? "flash" : "gemm";
      const double e = rel_err(to_f32_cpu(got), to_f32_cpu(want), "encoder_attention");
      std::printf("encoder_attention + rope %s T=%lld H=%d D=%d: rel err %.3g\n", name,
                  static_cast<long long>(T), c.heads, c.head_dim, e);
      EXPECT_LE(e, c.tol) << name;
      if (b != Backend::kFlash) continue;
      // The same rotation first, in place, then the attention without tables.
      const Tensor base2 = qkv.gpu_base.clone();
      Tensor dev2 = base2.narrow(1, 0, 3 * Q), qk = base2.narrow(1, 0, 2 * Q);
      kernels::rotate_pairs(qk, gcs, gsn, c.head_dim);
      kernels::EncoderAttention plain = a;
      plain.rope_cos = plain.rope_sin = nullptr;
      Tensor two = Tensor::empty({T, Q}, c.dt, gpu());
      kernels::encoder_attention(two, dev2, starts, plain, arena);
      EXPECT_TRUE(same_bytes(got, two)) << "flash with tables vs rotate_pairs then flash";
    }
  }
}

// Attention never crosses sequences: changing the second sequence leaves the first's rows alone.
TEST(GpuEncoder, AttentionStaysWithinItsSequence) {
  const int H = 2, D = 72;
  const int64_t Q = H * D;
  const std::vector<int64_t> starts{0, 50, 90};
  Tensor a = random_cpu({90, 3 * Q}, DType::kBF16, 5);
  Tensor b = a.clone();
  Tensor other = random_cpu({40, 3 * Q}, DType::kBF16, 6);
  b.narrow(0, 50, 40).copy_from(other);
  const kernels::EncoderAttention args{H, D, 0.2f};
  Arena arena(gpu());
  Tensor oa = Tensor::empty({90, Q}, DType::kBF16, gpu()), ob = oa.clone();
  kernels::encoder_attention(oa, a.to(gpu()), starts, args, arena);
  kernels::encoder_attention(ob, b.to(gpu()), starts, args, arena);
  EXPECT_TRUE(
      same_bytes(host(oa).narrow(0, 0, 50).contiguous(), host(ob).narrow(0, 0, 50).contiguous()));
  EXPECT_GT(max_abs_diff(to_f32_cpu(host(oa).narrow(0, 50, 40).contiguous()),
                         to_f32_cpu(host(ob).narrow(0, 50, 40).contiguous())),
            0.01f);
}

TEST(GpuEncoder, RotatePairsOnStridedRows) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const int64_t T = 129;
    const int hd = 72;
    StridedPair x = strided_pair(T, 2 * 3 * hd, 24, dt, 9);
    const Tensor cs = random_cpu({T, hd / 2}, DType::kF32, 10);
    const Tensor sn = random_cpu({T, hd / 2}, DType::kF32, 11);
    kernels::rotate_pairs(x.host, cs, sn, hd);
    Tensor xd = x.dev;
    kernels::rotate_pairs(xd, cs.to(gpu()), sn.to(gpu()), hd);
    // The padding columns stay as they were, the rotated ones agree to the storage's rounding.
    const Tensor got = to_f32_cpu(x.gpu_base), want = to_f32_cpu(x.host_base);
    EXPECT_LE(rel_err(got, want), dt == DType::kF32 ? 1e-6 : 4e-3) << dtype_name(dt);
    EXPECT_GT(rel_err(want, to_f32_cpu(random_cpu({T, 2 * 3 * hd + 24}, dt, 9))), 0.1)
        << "nothing rotated";
  }
}

TEST(GpuEncoder, GeluBothForms) {
  for (bool tanh_approx : {true, false})
    for (DType dt : {DType::kF32, DType::kBF16}) {
      StridedPair x = strided_pair(77, 300, 4, dt, 21, -6.0f, 6.0f);
      Tensor want = Tensor::empty({77, 300}, dt), got = Tensor::empty({77, 300}, dt, gpu());
      poison(got);
      kernels::gelu(want, x.host, tanh_approx);
      kernels::gelu(got, x.dev, tanh_approx);
      EXPECT_LE(rel_err(to_f32_cpu(got), to_f32_cpu(want)), dt == DType::kF32 ? 1e-6 : 4e-3)
          << tanh_approx << " " << dtype_name(dt);
      // gelu(-6) ~ 0 and gelu(6) ~ 6: the two forms differ measurably in between.
      const float v = to_f32_cpu(want).ptr<float>()[0], in = to_f32_cpu(x.host).ptr<float>()[0];
      EXPECT_NEAR(v, 0.5f * in * (1.0f + std::erf(in / std::sqrt(2.0f))), 0.02f * std::abs(in));
    }
}

TEST(GpuEncoder, GatherMeanRows) {
  for (int n : {1, 3}) {
    const Tensor x = random_cpu({50, 200}, DType::kBF16, 31);
    std::vector<int32_t> idx;
    for (int r = 0; r < 40; ++r)
      for (int j = 0; j < n; ++j) idx.push_back((r * 7 + j * 13) % 50);
    Tensor want = Tensor::empty({40, 200}, DType::kBF16);
    kernels::gather_mean_rows(want, x, i32(idx), n);
    Tensor got = Tensor::empty({40, 200}, DType::kBF16, gpu());
    poison(got);
    kernels::gather_mean_rows(got, x.to(gpu()), i32(idx).to(gpu()), n);
    EXPECT_LE(rel_err(to_f32_cpu(got), to_f32_cpu(want)), 4e-3) << n;
    // An independent check of one row: the mean of its sources.
    const Tensor xf = to_f32_cpu(x), wf = to_f32_cpu(want);
    float mean = 0;
    for (int j = 0; j < n; ++j)
      mean += xf.ptr<float>()[idx[static_cast<size_t>(5 * n + j)] * 200 + 3];
    EXPECT_NEAR(wf.ptr<float>()[5 * 200 + 3], mean / static_cast<float>(n), 0.01f);
  }
}

}  // namespace
}  // namespace atom::test
