// Tuning knobs of the CUDA linear op, for benchmarks and tests.
#pragma once

namespace atom::kernels::cuda {

// Products with at most this many rows use the skinny kernel (linear_skinny.cu) instead of
// cuBLASLt; 0 sends everything to cuBLASLt. Default: ATOM_SKINNY_GEMM_MAX_M, else 0 (on the H200
// the end-to-end batch-1 decode was fastest with cuBLASLt throughout; docs/performance.md).
int linear_skinny_max_m();
void linear_set_skinny_max_m(int m);

}  // namespace atom::kernels::cuda
