// Tuning knobs of the CUDA linear op, for benchmarks and tests.
#pragma once

#include <cstdint>

namespace atom::kernels::cuda {

// Products with at most this many rows (capped at 4, the kernel's limit) use the skinny kernel
// (linear_skinny.cu) instead of cuBLASLt; 0 sends everything to cuBLASLt. Default:
// ATOM_SKINNY_GEMM_MAX_M, else 2. On the H200 (Llama-3.1-8B decode step, docs/performance.md)
// skinny with K split over warps takes 4.26-4.28 ms at batch 1 (cuBLASLt 4.93-4.95 before the
// split) and 4.55 at batch 2 (cuBLASLt 4.76-4.77), but 5.26 at batch 3 (4.75) and 6.11 at
// batch 4 (4.82); fusing the RMSNorms into it was slower (branch fused-skinny-decode-experiment).
int linear_skinny_max_m();
void linear_set_skinny_max_m(int m);
// Skinny products with fewer output columns than this (and K >= 1,024) split K over the warps of
// a block (linear_skinny.cu). Default: ATOM_SKINNY_SPLIT_MAX_N, else every product (on the H200,
// Llama-3.1-8B batch-1 decode step: 4.24 ms splitting all, 4.41-4.43 splitting N < 8,192 only,
// 4.81 splitting none).
int64_t linear_skinny_split_max_n();
void linear_set_skinny_split_max_n(int64_t n);

}  // namespace atom::kernels::cuda
