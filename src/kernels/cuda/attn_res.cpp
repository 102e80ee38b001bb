// CUDA entry point of the attention residuals' mix (kernel in attn_res.cu).
#include "kernels/attn_res.h"

#include "kernels/cuda/host_common.h"

namespace atom::kernels::cuda {

static_assert(kAttnResMaxRows == kAttnResLaunchMaxRows);

void attn_res(Tensor& out, const Tensor& blocks, int64_t n, const Tensor& w, float eps) {
  launch_attn_res(mat_of(out, "attn_res"), blocks.ptr<float>(), blocks.size(0), blocks.size(1),
                  blocks.size(2), static_cast<int>(n), w.ptr<float>(), eps, current_stream());
  launch_check("attn_res");
}

}  // namespace atom::kernels::cuda
