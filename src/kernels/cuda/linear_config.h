// Tuning knobs of the CUDA linear op, for benchmarks and tests.
#pragma once

namespace atom::kernels::cuda {

// Products with at most this many rows use the skinny kernel (linear_skinny.cu) instead of
// cuBLASLt; 0 sends everything to cuBLASLt. Default: ATOM_SKINNY_GEMM_MAX_M, else 2 (measured on the H200: cuBLASLt wins from M = 3).
int linear_skinny_max_m();
void linear_set_skinny_max_m(int m);

}  // namespace atom::kernels::cuda
