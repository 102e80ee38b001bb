// Path selection of the CUDA FP8 linear (linear_fp8.cpp), for tests and benchmarks.
#pragma once

#include "kernels/cuda_tuning.h"
#include "kernels/linear_fp8.h"

namespace atom::kernels::cuda {

// The path (Fp8Path), the wgmma GEMM's tiles (Fp8Tiles) and the skinny kernel's rows per block
// are CudaTuning's fp8_path, fp8_tiles and fp8_skinny_rows (kernels/cuda_tuning.h).

// The kernel linear_fp8 would run for these operands under the calling thread's CudaTuning:
// "skinny", "wgmma_tma", "wgmma" (the cp.async variant), "wgmma_splitk" (the same, K split) or
// "general" (x and w on the GPU, shapes already valid).
const char* linear_fp8_kernel_for(const Tensor& x, const Fp8Weight& w);

}  // namespace atom::kernels::cuda
