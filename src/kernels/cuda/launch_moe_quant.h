// Launchers of the quantised-expert paths, beside launch.h's: fused_moe over MXFP4 (W4A16) or
// FP8 (W8A16) experts, and the random bytes --load-format dummy fills MXFP4 blocks and scales with.
#pragma once

#include "kernels/cuda/launch.h"

namespace atom::kernels::cuda {

// The scales of quantised experts, whose codes MoeLaunch::w13 and w2 then point at.
//   MXFP4 (fp8_bn 0): U8 blocks [S, 2I, H/2] and [S, H, I/2], two e2m1 values a byte, the low
//     nibble first; e8m0 scales s13 [S, H/32, 2I] and s2 [S, I/32, H] U8.
//   FP8 (fp8_bn > 0): e4m3 codes [S, 2I, H] and [S, H, I]; F32 scales s13 [S, 2I / fp8_bn,
//     ceil(H / fp8_bk)] and s2 [S, ceil(H / fp8_bn), ceil(I / fp8_bk)] (fp8_bk 0: one a row),
//     weight = bf16(float(code) * scale of its block).
struct MoeQuantScales {
  const void* s13 = nullptr;
  const void* s2 = nullptr;
  int fp8_bn = 0, fp8_bk = 0;
};
// fused_moe with MXFP4 or FP8 experts (BF16 activations), on the same paths as launch_fused_moe.
void launch_fused_moe_quant(const MoeLaunch& a, const MoeQuantScales& scales, cudaStream_t s);

// data[i] = min(hi, lo + floor((hi - lo + 1) * random_uniform(seed, i))), i < n
void launch_fill_bytes(uint8_t* data, int64_t n, uint64_t seed, int lo, int hi, cudaStream_t s);

}  // namespace atom::kernels::cuda
