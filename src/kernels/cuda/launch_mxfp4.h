// Launchers of the MXFP4 (W4A16) paths, beside launch.h's: fused_moe over MXFP4 experts and the
// random bytes --load-format dummy fills their blocks and scales with.
#pragma once

#include "kernels/cuda/launch.h"

namespace atom::kernels::cuda {

// The e8m0 scales of MXFP4 experts, whose U8 blocks MoeLaunch::w13 and w2 then point at
// ([S, 2I, H/2] and [S, H, I/2], two e2m1 values a byte, the low nibble first).
struct MoeMxfp4Scales {
  const void* s13 = nullptr;  // [S, H/32, 2I] U8
  const void* s2 = nullptr;   // [S, I/32, H] U8
};
// fused_moe with MXFP4 experts (BF16 activations), on the same paths as launch_fused_moe.
void launch_fused_moe_mxfp4(const MoeLaunch& a, const MoeMxfp4Scales& scales, cudaStream_t s);

// data[i] = min(hi, lo + floor((hi - lo + 1) * random_uniform(seed, i))), i < n
void launch_fill_bytes(uint8_t* data, int64_t n, uint64_t seed, int lo, int hi, cudaStream_t s);

}  // namespace atom::kernels::cuda
