// Choices of the CUDA attention op, for benchmarks and tests (defaults suit the H200).
#pragma once

namespace atom::kernels::cuda {

enum class PrefillAttention {
  kAuto,  // wgmma for head_dim 64/128, else the mma.sync kernel
  kMma,   // the mma.sync (FlashAttention-2 style) kernel
  kSimple,  // the FP32 one-warp-per-head kernel (also for decode)
};
// Default: ATOM_ATTENTION_BACKEND = auto | mma | simple.
void attention_set_backend(PrefillAttention b);
PrefillAttention attention_backend();
// 16-row MMA atoms per warp of the mma.sync prefill kernel: 0 picks (default, or
// ATOM_ATTENTION_M_ATOMS), 1 or 2 force.
void attention_set_m_atoms(int m);

}  // namespace atom::kernels::cuda
