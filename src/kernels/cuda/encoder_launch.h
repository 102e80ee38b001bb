// The launchers of encoder.cu (kernels/encoder.h's small kernels), as launch.h declares the others.
#pragma once

#include "kernels/cuda/launch.h"

namespace atom::kernels::cuda {

// p[r] = softmax(s[r]) over rows of `cols` F32 scores, p of type ptype, both [rows, cols] packed.
void launch_softmax_rows(const float* s, void* p, Elem ptype, int64_t rows, int64_t cols,
                         cudaStream_t stream);
// cs, sn [x.rows, head_dim / 2] F32
void launch_rotate_pairs(Mat x, const float* cs, const float* sn, int head_dim,
                         cudaStream_t stream);
void launch_gelu(Mat out, Mat x, bool tanh_approx, cudaStream_t stream);
// dst[r, h * dd + c] = c < ds ? src[r, h * ds + c] : 0 for h < heads, c < dd (heads re-pitched
// from ds to dd channels: padded with zeros, or cut)
void launch_copy_heads(Mat dst, Mat src, int heads, int dd, int ds, cudaStream_t stream);
// The same two channels a thread, each source pair (2m, 2m + 1) first turned by row r's angle m
// when cs and sn are given ([rows, ds / 2] F32; rotate_pairs' rule); BF16/F16 of one type, even
// dd and ds, 4-byte aligned rows. Returns false, launching nothing, where it does not apply.
bool launch_copy_head_pairs(Mat dst, Mat src, int heads, int dd, int ds, const float* cs,
                            const float* sn, cudaStream_t stream);
// idx [out.rows * n]
void launch_gather_mean_rows(Mat out, Mat x, const int32_t* idx, int n, cudaStream_t stream);

}  // namespace atom::kernels::cuda
