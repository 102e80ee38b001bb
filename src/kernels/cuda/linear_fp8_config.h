// Path selection of the CUDA FP8 linear (linear_fp8.cpp), for tests and benchmarks.
#pragma once

#include <string>

#include "kernels/cuda_tuning.h"
#include "kernels/linear_fp8.h"

namespace atom::kernels::cuda {

// The path (Fp8Path), the wgmma GEMM's tiles (Fp8Tiles) and the skinny kernel's rows per block
// are CudaTuning's fp8_path, fp8_tiles and fp8_skinny_rows (kernels/cuda_tuning.h).

// The kernel linear_fp8 would run for these operands under the calling thread's CudaTuning:
// "cublaslt", "skinny", "wgmma_tma", "wgmma" (the cp.async variant), "wgmma_splitk" (the same, K
// split) or "general" (x and w on the GPU, shapes already valid). `out` (optional; the choice
// of cuBLASLt depends on its dtype, stride and alignment): a contiguous BF16 [M, N] when absent.
const char* linear_fp8_kernel_for(const Tensor& x, const Fp8Weight& w, const Tensor& out = {});

// Why cuBLASLt's FP8 matmul cannot compute linear_fp8(out, x, w) ("" when it can): the scalings
// linear_fp8_cublaslt.cpp maps, or cuBLASLt's own answer (its heuristic's status, or no
// algorithm) for this shape on this GPU. Asks the heuristic once per shape (cached).
std::string linear_fp8_cublaslt_status(const Tensor& x, const Fp8Weight& w, const Tensor& out);

}  // namespace atom::kernels::cuda
