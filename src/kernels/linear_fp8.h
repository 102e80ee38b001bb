// Linear products with FP8 (float8_e4m3fn) weights, as FP8 checkpoints store them: the weight
// stays FP8 in memory and is scaled in the product. The scale grid is the checkpoint's
// (`weight_scale_inv` for block-scaled `fp8`, `weight_scale` for compressed-tensors/fbgemm):
//   W[n, k] = float(w[n, k]) * scale[n / block_n, k / block_k]          (Fp8Granularity::kBlock)
//   W[n, k] = float(w[n, k]) * scale[n]                                 (kChannel)
//   W[n, k] = float(w[n, k]) * scale[0]                                 (kTensor)
// Activations are quantised to FP8 inside the product: per 1×block_k group of a row, dynamic
// (kBlock, the DeepSeek recipe), per token dynamic, or with a static per-tensor `input_scale`
// (compressed-tensors `dynamic: false`). The CPU reference computes in fp32 on the dequantised
// weight and the same activation quantisation, so a kernel test compares like with like.
#pragma once

#include <algorithm>

#include "kernels/activation.h"
#include "kernels/dispatch.h"
#include "kernels/rms_norm.h"

namespace atom::kernels {

enum class Fp8Granularity : uint8_t { kTensor, kChannel, kBlock };
enum class Fp8Activation : uint8_t {
  kBlockDynamic,  // per row, per group of block_k columns: scale = amax / 448 (kBlock weights)
  kTokenDynamic,  // per row: scale = amax / 448
  kTensorStatic,  // input_scale [1] F32 from the checkpoint
  kNone,          // activations stay BF16/F32 (weight-only FP8; W8A16)
};

struct Fp8Weight {
  Tensor w;      // [N, K] F8E4M3, contiguous
  Tensor scale;  // F32: kBlock [ceil(N / block_n), ceil(K / block_k)]; kChannel [N]; kTensor [1]
  Fp8Granularity granularity = Fp8Granularity::kBlock;
  int block_n = 128, block_k = 128;  // kBlock only; partial edge blocks use the ceil-sized grid
  Fp8Activation activation = Fp8Activation::kBlockDynamic;
  Tensor input_scale;  // [1] F32 for kTensorStatic, else undefined
};

// The activation quantisation, exactly (CPU and CUDA): per group (kBlockDynamic: block_k columns
// of a row; kTokenDynamic: the whole row) amax = max(max |x|, kFp8AmaxFloor), scale = amax / 448,
// q = e4m3(x / scale) rounded to nearest even, saturated at ±448; kTensorStatic: scale =
// input_scale[0]. The floor keeps an all-zero group finite (DeepGEMM's per-token cast clamps at
// 1e-4 too).
constexpr float kFp8Max = 448.0f;
constexpr float kFp8AmaxFloor = 1e-4f;

// out [M, N] = quant(x) · Wᵀ (+ bias), fp32 accumulation.  x [M, K] BF16 (CUDA) or F32/BF16 (CPU);
// out BF16 or F32; bias [N] of any float dtype. `workspace` (CUDA, optional): contiguous device
// memory of at least linear_fp8_workspace_bytes(M, K, w) bytes for the quantised activations (an
// arena tensor, so the call can be captured in a CUDA graph); without one the CUDA path uses a
// buffer held per stream, grown outside graph capture (growing it during a capture is an error).
// Fails with a message naming what is wrong unless the shapes, dtypes and scale grids agree
// (shared by the CPU and CUDA entry points).
void check_linear_fp8_args(const Tensor& out, const Tensor& x, const Fp8Weight& w,
                           const Tensor& bias);

namespace cpu {
void linear_fp8(Tensor& out, const Tensor& x, const Fp8Weight& w, const Tensor& bias);
}
namespace cuda {
int64_t linear_fp8_workspace_bytes(int64_t m, int64_t k, const Fp8Weight& w);
void linear_fp8(Tensor& out, const Tensor& x, const Fp8Weight& w, const Tensor& bias,
                const Tensor& workspace);
}  // namespace cuda

inline void linear_fp8(Tensor& out, const Tensor& x, const Fp8Weight& w, const Tensor& bias = {},
                       const Tensor& workspace = {}) {
  check_same_device("linear_fp8", out.device(), {&x, &w.w, &w.scale, &w.input_scale, &bias});
  if (out.device().is_cpu()) return cpu::linear_fp8(out, x, w, bias);
  ATOM_KERNEL_CUDA("linear_fp8", cuda::linear_fp8(out, x, w, bias, workspace));
}

// ---- Activations quantised ahead of the product ----
// The op before an FP8 product (an RMSNorm, SiLU·mul) may write the product's quantised input
// itself instead of its 16-bit output (the spec's *_QUANT_FUSION switches), saving the 16-bit
// write and read and the quantisation's own pass. What it writes is exactly what linear_fp8
// would have computed from that output: the same rule (above) on the same rounded values.

// How a product quantises its input (a weight's activation, block_k and input_scale).
struct Fp8Quant {
  Fp8Activation activation = Fp8Activation::kBlockDynamic;  // never kNone
  int64_t block_k = 128;                                    // kBlockDynamic: columns per group
  Tensor input_scale;                                       // kTensorStatic: [1] F32
  static Fp8Quant of(const Fp8Weight& w) { return {w.activation, w.block_k, w.input_scale}; }
  // Columns per scale for rows of k columns (the whole row unless kBlockDynamic).
  int64_t group(int64_t k) const {
    return activation == Fp8Activation::kBlockDynamic ? block_k : std::max<int64_t>(k, 1);
  }
};

// Quantised activations: codes [M, K] F8E4M3 (contiguous) and the F32 scales, that of row m and
// group g at scales[g * fp8_scale_ld(M) + m] (kTensorStatic: input_scale in every row's place).
// `scales` holds fp8_input_scale_count(M, K, quant) floats: beyond the [G, ld] grid, room for the
// CUDA path to lay a grid out again for cuBLASLt.
struct Fp8Input {
  Tensor codes;
  Tensor scales;
  Fp8Quant quant;
  int64_t rows() const { return codes.size(0); }
  int64_t cols() const { return codes.size(1); }
};
inline int64_t fp8_scale_ld(int64_t m) { return (m + 3) / 4 * 4; }
inline int64_t fp8_input_scale_count(int64_t m, int64_t k, const Fp8Quant& q) {
  const int64_t g = q.group(k);
  return 2 * ((k + g - 1) / g) * fp8_scale_ld(m);
}
// Checks `in` is a well-formed quantised input of `op` (shapes, dtypes, the scales' length).
void check_fp8_input(const char* op, const Fp8Input& in);
// check_linear_fp8_args for a product on quantised inputs, and that they were quantised the way
// the weight quantises its input (an error naming both otherwise).
void check_linear_fp8_input(const Tensor& out, const Fp8Input& x, const Fp8Weight& w,
                            const Tensor& bias);

// in = the quantisation of x [M, K] (rows strided) by in.quant: what linear_fp8 computes inside.
namespace cpu {
void quantize_fp8(Fp8Input& in, const Tensor& x);
void linear_fp8(Tensor& out, const Fp8Input& x, const Fp8Weight& w, const Tensor& bias);
}  // namespace cpu
namespace cuda {
void quantize_fp8(Fp8Input& in, const Tensor& x);
void linear_fp8(Tensor& out, const Fp8Input& x, const Fp8Weight& w, const Tensor& bias,
                const Tensor& workspace);
}  // namespace cuda

inline void quantize_fp8(Fp8Input& in, const Tensor& x) {
  check_same_device("quantize_fp8", x.device(), {&in.codes, &in.scales, &in.quant.input_scale});
  if (x.device().is_cpu()) return cpu::quantize_fp8(in, x);
  ATOM_KERNEL_CUDA("quantize_fp8", cuda::quantize_fp8(in, x));
}

// out [M, N] = x · Wᵀ (+ bias) on activations quantised before the call; x.quant must be the
// weight's (Fp8Quant::of(w)). Equal, bit for bit, to linear_fp8 on the activations x quantises.
inline void linear_fp8(Tensor& out, const Fp8Input& x, const Fp8Weight& w, const Tensor& bias = {},
                       const Tensor& workspace = {}) {
  check_same_device("linear_fp8", out.device(),
                    {&x.codes, &x.scales, &w.w, &w.scale, &w.input_scale, &bias});
  if (out.device().is_cpu()) return cpu::linear_fp8(out, x, w, bias);
  ATOM_KERNEL_CUDA("linear_fp8", cuda::linear_fp8(out, x, w, bias, workspace));
}

// The fused ops. Each writes into `in` (codes and scales allocated by the caller, in.quant the
// product's) exactly what quantize_fp8 writes from the unfused op's output, and returns true; on
// CUDA a shape the fused kernel does not take (rows over 8,192 values for the norm, 1x128 groups
// of another width, F32 activations, unaligned rows) returns false, computing nothing, and the
// caller runs the two ops.
//   rms_norm_fp8: rms_norm(x) (with the residual add, as kernels::rms_norm), rounded to x's dtype
//   glu_fp8: glu(x) (x [M, 2 I] -> [M, I]), rounded to x's dtype
namespace cpu {
bool rms_norm_fp8(Fp8Input& in, const Tensor& x, Tensor* residual, const Tensor& w, float eps,
                  RmsNormKind kind);
bool glu_fp8(Fp8Input& in, const Tensor& x, const Glu& a);
}  // namespace cpu
namespace cuda {
bool rms_norm_fp8(Fp8Input& in, const Tensor& x, Tensor* residual, const Tensor& w, float eps,
                  RmsNormKind kind);
bool glu_fp8(Fp8Input& in, const Tensor& x, const Glu& a);
}  // namespace cuda

inline bool rms_norm_fp8(Fp8Input& in, const Tensor& x, Tensor* residual, const Tensor& w,
                         float eps, RmsNormKind kind = RmsNormKind::kLlama) {
  check_same_device("rms_norm_fp8", x.device(),
                    {&in.codes, &in.scales, &in.quant.input_scale, residual, &w});
  if (x.device().is_cpu()) return cpu::rms_norm_fp8(in, x, residual, w, eps, kind);
  bool done = false;
  ATOM_KERNEL_CUDA("rms_norm_fp8", done = cuda::rms_norm_fp8(in, x, residual, w, eps, kind));
  return done;
}

inline bool glu_fp8(Fp8Input& in, const Tensor& x, const Glu& a) {
  check_same_device("glu_fp8", x.device(), {&in.codes, &in.scales, &in.quant.input_scale});
  glu_check("glu_fp8", a);
  if (x.device().is_cpu()) return cpu::glu_fp8(in, x, a);
  bool done = false;
  ATOM_KERNEL_CUDA("glu_fp8", done = cuda::glu_fp8(in, x, a));
  return done;
}

}  // namespace atom::kernels
