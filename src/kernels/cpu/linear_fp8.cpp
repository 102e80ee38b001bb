// The FP8 linear's reference: the activations are quantised exactly as linear_fp8.h says (the
// same e4m3 rounding the CUDA kernels use), then each k-group's partial dot product of the two
// FP8 operands is taken in fp32 (products of two e4m3 values are exact in fp32) and scaled by the
// activation group's and the weight block's scales, as the block-scaled GEMM does.
#include "kernels/linear_fp8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/access.h"

namespace atom::kernels {

void check_linear_fp8_args(const Tensor& out, const Tensor& x, const Fp8Weight& w,
                           const Tensor& bias) {
  cpu::check_rows("linear_fp8", out, "out");
  cpu::check_rows("linear_fp8", x, "x");
  ATOM_CHECK(w.w.dim() == 2 && w.w.is_contiguous() && w.w.dtype() == DType::kF8E4M3,
             "linear_fp8: weight must be contiguous 2-D F8E4M3, got {}", w.w.str());
  const int64_t M = x.size(0), K = x.size(1), N = w.w.size(0);
  ATOM_CHECK(w.w.size(1) == K && out.size(0) == M && out.size(1) == N,
             "linear_fp8: x {} · w {}ᵀ -> out {}", x.str(), w.w.str(), out.str());
  ATOM_CHECK(w.scale.defined() && w.scale.dtype() == DType::kF32 && w.scale.is_contiguous(),
             "linear_fp8: weight scale must be contiguous F32, got {}", w.scale.str());
  switch (w.granularity) {
    case Fp8Granularity::kBlock: {
      ATOM_CHECK(w.block_n > 0 && w.block_k > 0, "linear_fp8: block size {}x{}", w.block_n,
                 w.block_k);
      const int64_t gn = (N + w.block_n - 1) / w.block_n, gk = (K + w.block_k - 1) / w.block_k;
      ATOM_CHECK(w.scale.dim() == 2 && w.scale.size(0) == gn && w.scale.size(1) == gk,
                 "linear_fp8: block scale {} for weight {} in {}x{} blocks (want [{}, {}])",
                 w.scale.str(), w.w.str(), w.block_n, w.block_k, gn, gk);
      break;
    }
    case Fp8Granularity::kChannel:
      ATOM_CHECK(w.scale.numel() == N, "linear_fp8: channel scale {} for N={}", w.scale.str(), N);
      break;
    case Fp8Granularity::kTensor:
      ATOM_CHECK(w.scale.numel() == 1, "linear_fp8: tensor scale {}", w.scale.str());
      break;
  }
  ATOM_CHECK(w.activation != Fp8Activation::kBlockDynamic || w.block_k > 0,
             "linear_fp8: block-dynamic activations need block_k > 0");
  ATOM_CHECK(w.activation != Fp8Activation::kTensorStatic ||
                 (w.input_scale.defined() && w.input_scale.numel() == 1 &&
                  w.input_scale.dtype() == DType::kF32),
             "linear_fp8: static activations need a [1] F32 input_scale, got {}",
             w.input_scale.str());
  ATOM_CHECK(!bias.defined() || (bias.numel() == N && bias.is_contiguous()),
             "linear_fp8: bias {} for N={}", bias.str(), N);
}

namespace cpu {

void linear_fp8(Tensor& out, const Tensor& x, const Fp8Weight& w, const Tensor& bias) {
  check_linear_fp8_args(out, x, w, bias);
  const int64_t M = x.size(0), K = x.size(1), N = w.w.size(0);
  const bool quant = w.activation != Fp8Activation::kNone;
  // Activation groups: columns [g ga, (g + 1) ga) of a row share scale sx[m, g].
  const int64_t ga =
      w.activation == Fp8Activation::kBlockDynamic ? w.block_k : std::max<int64_t>(K, 1);
  const int64_t G = (K + ga - 1) / ga;
  std::vector<float> xv(static_cast<size_t>(M * K)), sx(static_cast<size_t>(M * G), 1.0f);
  for (int64_t m = 0; m < M; ++m) {
    float* r = xv.data() + m * K;
    row_to_float(x, m, r);
    if (!quant) continue;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t k0 = g * ga, k1 = std::min(K, k0 + ga);
      float s;
      if (w.activation == Fp8Activation::kTensorStatic) {
        s = w.input_scale.ptr<float>()[0];
      } else {
        float amax = 0.0f;
        for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(r[k]));
        s = std::max(amax, kFp8AmaxFloor) / kFp8Max;
      }
      sx[m * G + g] = s;
      for (int64_t k = k0; k < k1; ++k) r[k] = f8e4m3_to_f32(f32_to_f8e4m3(r[k] / s));
    }
  }
  // Weight scale of (n, k): block (n / bn, k / bk), channel n, tensor 0. The reduction is split
  // at the boundaries of both the weight's k blocks and the activation's groups.
  const float* sw = w.scale.ptr<float>();
  const int64_t bn = w.granularity == Fp8Granularity::kBlock ? w.block_n : 1;
  const int64_t bk = w.granularity == Fp8Granularity::kBlock ? w.block_k : std::max<int64_t>(K, 1);
  const int64_t GK = (K + bk - 1) / bk;
  auto wscale = [&](int64_t n, int64_t kb) {
    switch (w.granularity) {
      case Fp8Granularity::kBlock:
        return sw[(n / bn) * GK + kb];
      case Fp8Granularity::kChannel:
        return sw[n];
      default:
        return sw[0];
    }
  };
  // Split points: every multiple of bk or ga below K.
  std::vector<int64_t> cuts;
  for (int64_t k = 0; k < K; ++k)
    if (k % bk == 0 || k % ga == 0) cuts.push_back(k);
  cuts.push_back(K);
  std::vector<float> bf;
  if (bias.defined()) {
    bf.resize(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) bf[n] = load(bias.data(), bias.dtype(), n);
  }
  const uint8_t* wq = w.w.ptr<uint8_t>();
  std::vector<float> of(static_cast<size_t>(M * N));
#pragma omp parallel if (M * N * K > kParallelMin * 16)
  {
    std::vector<float> wrow(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) wrow[k] = f8e4m3_to_f32(wq[n * K + k]);
      for (int64_t m = 0; m < M; ++m) {
        const float* xr = xv.data() + m * K;
        float acc = 0.0f;
        for (size_t c = 0; c + 1 < cuts.size(); ++c) {
          const int64_t k0 = cuts[c], k1 = cuts[c + 1];
          float part = 0.0f;
          for (int64_t k = k0; k < k1; ++k) part += xr[k] * wrow[k];
          acc += part * (sx[m * G + k0 / ga] * wscale(n, k0 / bk));
        }
        if (!bf.empty()) acc += bf[n];
        of[m * N + n] = acc;
      }
    }
  }
  for (int64_t m = 0; m < M; ++m) float_to_row(out, m, of.data() + m * N);
}

}  // namespace cpu
}  // namespace atom::kernels
