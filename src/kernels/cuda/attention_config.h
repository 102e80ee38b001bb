// Choices of the CUDA attention op, for benchmarks and tests (defaults suit the H200).
#pragma once

namespace atom::kernels::cuda {

enum class PrefillAttention {
  kAuto,    // wgmma for head_dim 64/128, else the mma.sync kernel
  kMma,     // the mma.sync (FlashAttention-2 style) kernel
  kSimple,  // the FP32 one-warp-per-head kernel (also for decode)
};
// Default: ATOM_ATTENTION_BACKEND = auto | mma | simple.
void attention_set_backend(PrefillAttention b);
PrefillAttention attention_backend();
// 16-row MMA atoms per warp of the mma.sync prefill kernel: 0 picks (default, or
// ATOM_ATTENTION_M_ATOMS), 1 or 2 force.
void attention_set_m_atoms(int m);
// Warpgroups per CTA of the wgmma prefill kernel: 2 (128 rows, 128-key tiles) or 1 (64 rows,
// 64-key tiles, two CTAs per SM). Default: ATOM_WGMMA_WARPGROUPS, else 2.
void attention_set_wgmma_warpgroups(int n);
// K/V pipeline of the wgmma prefill kernel (BF16/F16 caches): 0 the serial loop (each GEMM waited
// before the softmax that follows), 2 or 3 the overlapped loop (the next tile's Q Kᵀ and the P V
// product in flight during the softmax) with that many K/V stages, 4 that loop warp-specialized
// (a producer warpgroup gathers K/V into mbarrier stages), 5 that with ping-pong of the two
// computing warpgroups, 6 that with two row tiles per CTA (the longest and the shortest of a
// (sequence, kv head)); one warpgroup uses 2 for 3 to 6. Default: ATOM_WGMMA_PIPELINE, else 6.
void attention_set_wgmma_pipeline(int stages);
// CTA order of the wgmma kernel: -1 (default) longest row tiles first across all (sequence, kv
// head)s for grids of at most four waves, within each (sequence, kv head) otherwise; 0 always
// within; 1 always across (tests).
void attention_set_wgmma_order_across(int mode);
// Split decode: the last CTA of a sequence merges the partials (default), or, when off, a
// separate combine kernel does.
void attention_set_merge_in_kernel(bool on);

}  // namespace atom::kernels::cuda
