// Tuning knobs of the CUDA linear op, for benchmarks and tests.
#pragma once

#include <cstdint>

namespace atom::kernels::cuda {

// Products with at most this many rows (capped at 4, the kernel's limit) use the skinny kernel
// (linear_skinny.cu) instead of cuBLASLt; 0 sends everything to cuBLASLt. Default:
// ATOM_SKINNY_GEMM_MAX_M, else 0. On the H200 (Llama-3.1-8B decode; a variant issuing the first
// weight loads before pdl_wait) skinny at M = 1 was within noise of cuBLASLt (5.07-5.08 against
// 5.11-5.14 ms per step) and slower at M = 2 (5.38 against 5.16) and M = 4 (6.24 against 5.17);
// fusing the RMSNorms, silu_mul and residual adds into it was slower still (branch
// fused-skinny-decode-experiment).
int linear_skinny_max_m();
void linear_set_skinny_max_m(int m);
// Skinny products with fewer output columns than this (and K >= 1,024) split K over the warps of
// a block (linear_skinny.cu). Default: ATOM_SKINNY_SPLIT_MAX_N, else 8,192.
int64_t linear_skinny_split_max_n();
void linear_set_skinny_split_max_n(int64_t n);
// 16-byte weight loads per row in flight per lane: 4 (default) or 8 (ATOM_SKINNY_UNROLL).
int linear_skinny_unroll();

}  // namespace atom::kernels::cuda
