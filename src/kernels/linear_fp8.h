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

#include "kernels/dispatch.h"

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

}  // namespace atom::kernels
