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

void check_fp8_input(const char* op, const Fp8Input& in) {
  ATOM_CHECK(in.codes.defined() && in.codes.dim() == 2 && in.codes.is_contiguous() &&
                 in.codes.dtype() == DType::kF8E4M3,
             "{}: quantised activations must be contiguous 2-D F8E4M3, got {}", op, in.codes.str());
  ATOM_CHECK(in.quant.activation != Fp8Activation::kNone &&
                 (in.quant.activation != Fp8Activation::kBlockDynamic || in.quant.block_k > 0),
             "{}: quantised activations need a dynamic or static quantisation (block_k {})", op,
             in.quant.block_k);
  ATOM_CHECK(in.quant.activation != Fp8Activation::kTensorStatic ||
                 (in.quant.input_scale.defined() && in.quant.input_scale.numel() == 1 &&
                  in.quant.input_scale.dtype() == DType::kF32),
             "{}: static activations need a [1] F32 input_scale, got {}", op,
             in.quant.input_scale.str());
  const int64_t want = fp8_input_scale_count(in.rows(), in.cols(), in.quant);
  ATOM_CHECK(in.scales.defined() && in.scales.is_contiguous() && in.scales.dtype() == DType::kF32 &&
                 in.scales.numel() >= want,
             "{}: scales of [{}, {}] quantised activations must be contiguous F32 of {} values, "
             "got {}",
             op, in.rows(), in.cols(), want, in.scales.str());
}

namespace cpu {

void quantize_fp8(Fp8Input& in, const Tensor& x) {
  check_fp8_input("quantize_fp8", in);
  check_rows("quantize_fp8", x, "x");
  const int64_t M = x.size(0), K = x.size(1);
  ATOM_CHECK(in.rows() == M && in.cols() == K, "quantize_fp8: x {} into codes {}", x.str(),
             in.codes.str());
  const int64_t ga = in.quant.group(K), G = (K + ga - 1) / ga, ld = fp8_scale_ld(M);
  uint8_t* q = in.codes.ptr<uint8_t>();
  float* sx = in.scales.ptr<float>();
  std::vector<float> r(static_cast<size_t>(K));
  for (int64_t m = 0; m < M; ++m) {
    row_to_float(x, m, r.data());
    for (int64_t g = 0; g < G; ++g) {
      const int64_t k0 = g * ga, k1 = std::min(K, k0 + ga);
      float s;
      if (in.quant.activation == Fp8Activation::kTensorStatic) {
        s = in.quant.input_scale.ptr<float>()[0];
      } else {
        float amax = 0.0f;
        for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(r[k]));
        s = std::max(amax, kFp8AmaxFloor) / kFp8Max;
      }
      sx[g * ld + m] = s;
      for (int64_t k = k0; k < k1; ++k) q[m * K + k] = f32_to_f8e4m3(r[k] / s);
    }
  }
}

}  // namespace cpu

void check_linear_fp8_input(const Tensor& out, const Fp8Input& x, const Fp8Weight& w,
                            const Tensor& bias) {
  check_fp8_input("linear_fp8", x);
  // Shapes and scale grids as for 16-bit activations (the codes stand in for x).
  check_linear_fp8_args(out, x.codes, w, bias);
  ATOM_CHECK(w.activation == x.quant.activation &&
                 (w.activation != Fp8Activation::kBlockDynamic || w.block_k == x.quant.block_k),
             "linear_fp8: activations quantised for another product (activation {} block_k {}, "
             "the weight wants {} {})",
             static_cast<int>(x.quant.activation), x.quant.block_k, static_cast<int>(w.activation),
             w.block_k);
}

namespace cpu {
namespace {
// out [M, N] = x · Wᵀ (+ bias) on activations xv [M, K] as floats: each k-range between the
// weight's k blocks and the activation's groups of ga columns summed in fp32, then scaled by the
// group's scale sx[(k / ga) * ld + m] (1 without sx) times the weight block's.
void product(Tensor& out, const std::vector<float>& xv, const float* sx, int64_t ld, int64_t ga,
             const Fp8Weight& w, const Tensor& bias) {
  const int64_t M = out.size(0), K = w.w.size(1), N = w.w.size(0);
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
          const float a = sx ? sx[(k0 / ga) * ld + m] : 1.0f;
          acc += part * (a * wscale(n, k0 / bk));
        }
        if (!bf.empty()) acc += bf[n];
        of[m * N + n] = acc;
      }
    }
  }
  for (int64_t m = 0; m < M; ++m) float_to_row(out, m, of.data() + m * N);
}
}  // namespace

void linear_fp8(Tensor& out, const Fp8Input& x, const Fp8Weight& w, const Tensor& bias) {
  check_linear_fp8_input(out, x, w, bias);
  const int64_t M = x.rows(), K = x.cols();
  std::vector<float> xv(static_cast<size_t>(M * K));
  const uint8_t* xq = x.codes.ptr<uint8_t>();
  for (int64_t i = 0; i < M * K; ++i) xv[i] = f8e4m3_to_f32(xq[i]);
  product(out, xv, x.scales.ptr<float>(), fp8_scale_ld(M), x.quant.group(K), w, bias);
}

// The FP8 product of 16-bit or F32 activations: quantised as above, then the product on the codes;
// kNone (W8A16): the activations as they are, each value in fp32.
void linear_fp8(Tensor& out, const Tensor& x, const Fp8Weight& w, const Tensor& bias) {
  check_linear_fp8_args(out, x, w, bias);
  const int64_t M = x.size(0), K = x.size(1);
  if (w.activation != Fp8Activation::kNone) {
    Fp8Input in;
    in.quant = Fp8Quant::of(w);
    in.codes = Tensor::empty({M, K}, DType::kF8E4M3);
    in.scales = Tensor::empty({fp8_input_scale_count(M, K, in.quant)}, DType::kF32);
    cpu::quantize_fp8(in, x);
    return cpu::linear_fp8(out, in, w, bias);
  }
  std::vector<float> xv(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m) row_to_float(x, m, xv.data() + m * K);
  product(out, xv, nullptr, 0, std::max<int64_t>(K, 1), w, bias);
}

// The reference of the fused ops: the unfused op into a buffer of x's dtype, then the
// quantisation.
bool rms_norm_fp8(Fp8Input& in, const Tensor& x, Tensor* residual, const Tensor& w, float eps,
                  RmsNormKind kind) {
  check_fp8_input("rms_norm_fp8", in);
  Tensor y = Tensor::empty({x.size(0), x.size(1)}, x.dtype());
  cpu::rms_norm(y, x, residual, w, eps, kind);
  cpu::quantize_fp8(in, y);
  return true;
}

bool glu_fp8(Fp8Input& in, const Tensor& x, const Glu& a) {
  check_fp8_input("glu_fp8", in);
  ATOM_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "glu_fp8: x {} is not [M, 2 I]", x.str());
  Tensor y = Tensor::empty({x.size(0), x.size(1) / 2}, x.dtype());
  cpu::glu(y, x, a);
  cpu::quantize_fp8(in, y);
  return true;
}

}  // namespace cpu
}  // namespace atom::kernels
