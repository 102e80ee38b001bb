// Path selection of the CUDA FP8 linear (linear_fp8.cpp), for tests and benchmarks.
#pragma once

#include "kernels/linear_fp8.h"

namespace atom::kernels::cuda {

// kAuto: skinny for M <= 4 where it applies, else the wgmma GEMM where it applies, else the
// general kernel. kNoSkinny: as kAuto without the skinny kernel. kGeneral: the general kernel
// always. Default kAuto, or ATOM_FP8_GEMM_PATH (auto, no_skinny, general).
enum class Fp8Path { kAuto, kNoSkinny, kGeneral };
Fp8Path linear_fp8_path();
void linear_fp8_set_path(Fp8Path p);

// The wgmma GEMM's variant: kTma, 128 x 256 tiles loaded by the bulk tensor copy engine
// (linear_fp8_gemm_tma.cu); kCpAsync, 128 x 128 tiles loaded with cp.async (linear_fp8_gemm.cu),
// with K split over several CTAs per tile when the tiles are fewer than the SMs; kAuto, by the
// measured waves of each (linear_fp8.cpp, tma_wins). Default kAuto, or ATOM_FP8_GEMM_TILES (auto,
// tma, cp_async).
enum class Fp8Tiles { kAuto, kTma, kCpAsync };
Fp8Tiles linear_fp8_tiles();
void linear_fp8_set_tiles(Fp8Tiles t);

// Weight rows per block of the skinny kernel, 2 or 4; 0: 4 at M = 1, else 2. Default
// ATOM_FP8_SKINNY_ROWS, else 0.
int linear_fp8_skinny_rows();
void linear_fp8_set_skinny_rows(int rows);

// The kernel linear_fp8 would run for these operands under the current path setting: "skinny",
// "wgmma_tma", "wgmma" (the cp.async variant), "wgmma_splitk" (the same, K split) or "general" (x
// and w on the GPU, shapes already valid).
const char* linear_fp8_kernel_for(const Tensor& x, const Fp8Weight& w);

}  // namespace atom::kernels::cuda
