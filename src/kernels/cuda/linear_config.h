// Tuning knobs of the CUDA linear op, for benchmarks and tests.
#pragma once

#include <cstdint>

namespace atom::kernels::cuda {

// Products with at most this many rows (capped at 4, the kernel's limit) use the skinny kernel
// (linear_skinny.cu) instead of cuBLASLt; 0 sends everything to cuBLASLt. Default:
// ATOM_SKINNY_GEMM_MAX_M, else 1. On the H200 (Llama-3.1-8B batch-1 decode step) skinny with K
// split over warps takes 4.24 ms against 4.93-4.95 with cuBLASLt (docs/performance.md); the
// unsplit kernel was slower than cuBLASLt at M = 2 (5.38 against 5.16) and M = 4 (6.24 against
// 5.17); fusing the RMSNorms into it was slower still (branch fused-skinny-decode-experiment).
int linear_skinny_max_m();
void linear_set_skinny_max_m(int m);
// Skinny products with fewer output columns than this (and K >= 1,024) split K over the warps of
// a block (linear_skinny.cu). Default: ATOM_SKINNY_SPLIT_MAX_N, else every product (on the H200,
// Llama-3.1-8B batch-1 decode step: 4.24 ms splitting all, 4.41-4.43 splitting N < 8,192 only,
// 4.81 splitting none).
int64_t linear_skinny_split_max_n();
void linear_set_skinny_split_max_n(int64_t n);

}  // namespace atom::kernels::cuda
