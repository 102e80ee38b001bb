// Launchers of the FP8 linear's kernels (linear_fp8.cu, linear_fp8_gemm.cu); the entry point
// (linear_fp8.cpp) checks shapes and picks the path. Plain pointers and sizes, as launch.h.
#pragma once

#include <string>

#include "kernels/cuda/launch.h"

namespace atom::kernels::cuda {

// Activation quantisation modes, as kernels::Fp8Activation.
enum class Fp8Act : int { kBlock = 0, kToken = 1, kStatic = 2, kNone = 3 };
// Weight scale granularity, as kernels::Fp8Granularity.
enum class Fp8Gran : int { kTensor = 0, kChannel = 1, kBlock = 2 };

// Quantised activations: xq [M, ldq] e4m3 (columns [K, ldq) zero), scales sx[g * ld_sx + m] for
// activation group g of `group` columns (kToken / kStatic: one group, the whole row).
struct Fp8Act8 {
  uint8_t* xq = nullptr;
  int64_t ldq = 0;
  float* sx = nullptr;
  int64_t ld_sx = 0;  // M rounded up to 4
  int64_t group = 0;
};

// x [M, K] BF16/F16/F32 (rows strided) -> a.xq, a.sx by `mode` (not kNone).
void launch_fp8_act_quant(Mat x, Fp8Act mode, const float* input_scale, const Fp8Act8& a,
                          cudaStream_t s);

// The fused ops (fused_quant.cu): an RMSNorm (rms_norm.cu's, the residual add first when
// `residual`; rows of x.cols values, w [x.cols]) or a gated activation (x [M, 2 I], act as
// launch_glu) whose output, rounded to x's 16-bit type, is quantised by `mode` into `a` in the
// same kernel. False, launching nothing, for what they do not take: F32 x, columns not a multiple
// of 8, unaligned rows, 1x128 groups of another width, norm rows over 8,192 values, per-token
// activation rows over 16,384.
bool launch_rms_norm_fp8(Mat x, const Mat* residual, const void* w, Elem w_type, float eps,
                         int kind, Fp8Act mode, const float* input_scale, const Fp8Act8& a,
                         cudaStream_t s);
bool launch_glu_fp8(Mat x, int64_t I, int act, float alpha, float limit, Fp8Act mode,
                    const float* input_scale, const Fp8Act8& a, cudaStream_t s);

struct Fp8GemmArgs {
  Mat out;    // [M, N] BF16 or F32
  Mat x;      // kNone: the BF16 activations
  Fp8Act8 a;  // else: the quantised activations
  Fp8Act act = Fp8Act::kBlock;
  int64_t m = 0, n = 0, k = 0;
  const uint8_t* w = nullptr;  // [N, K] e4m3
  const float* sw = nullptr;   // the weight's scale grid
  Fp8Gran gran = Fp8Gran::kBlock;
  int64_t bn = 128, bk = 128;  // kBlock
  const void* bias = nullptr;
  Elem bias_type = Elem::kF32;
  // Split-K (the cp.async GEMM only): `splits` CTAs per output tile each take a contiguous run of
  // the k blocks and write their fp32 totals to partial [splits, M, N]; a second kernel sums them
  // in split order and applies the outer scales and the bias.
  int splits = 1;
  float* partial = nullptr;
};

// Hopper wgmma GEMM on quantised activations: (gran kBlock, bn = bk = 128, act kBlock with group
// 128) or (gran kTensor/kChannel, act kToken/kStatic); K % 16 == 0, 16-byte aligned w, xq, sx.
bool fp8_gemm_wgmma_supported(const Fp8GemmArgs& g);
void launch_fp8_gemm_wgmma(const Fp8GemmArgs& g, cudaStream_t s);
// The same on 128 x 256 tiles loaded by TMA (linear_fp8_gemm_tma.cu); as supported above, and
// the driver's tensor-map encoder found.
bool fp8_gemm_tma_supported(const Fp8GemmArgs& g);
void launch_fp8_gemm_tma(const Fp8GemmArgs& g, cudaStream_t s);
// Any mode and shape (SIMT, fp32): the general path.
void launch_fp8_gemm_general(const Fp8GemmArgs& g, cudaStream_t s);
// M <= 4: one pass over the weight. K % 16 == 0, (kBlock) bk % 16 == 0, (quantised) group % 16
// == 0, 16-byte aligned w and xq rows (kNone: x rows 16-byte aligned, K % 8 == 0).
bool fp8_gemm_skinny_supported(const Fp8GemmArgs& g);
// rows: weight rows per block, 2 or 4.
void launch_fp8_gemm_skinny(const Fp8GemmArgs& g, cudaStream_t s, int rows);

// cuBLASLt's FP8 matmul on the quantised activations (linear_fp8_cublaslt.cpp), for the scalings
// it offers on sm_90: tensor weight with static (scalar x scalar) or token activations (scalar x
// outer vector), channel weight with token or static activations (outer vector x outer vector),
// 128x128 weight blocks with 1x128 activation groups (BLK128x128 x VEC128: ceil(K / 128) a
// multiple of 4, and a.ld_sx == m, the layout cuBLASLt reads). Bias added by a second kernel.
// Why cuBLASLt cannot run this product, or "" when it can: the rules above, else the heuristic's
// answer for the shape (asked once per shape, dtypes and alignments, and cached; never during
// stream capture of `s`, where a shape not planned before reports so).
std::string fp8_gemm_cublaslt_status(const Fp8GemmArgs& g, cudaStream_t s);
// Runs it; fails with the status when that is not "".
void launch_fp8_gemm_cublaslt(const Fp8GemmArgs& g, cudaStream_t s);

}  // namespace atom::kernels::cuda
