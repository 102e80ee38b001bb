// Placeholder until the CUDA MoE kernels land (branch moe-cuda): the entry points fail clearly.
#include "kernels/moe.h"

namespace atom::kernels::cuda {

void moe_route(Tensor&, Tensor&, const Tensor&, const Tensor&, const RouterArgs&) {
  fail("moe_route: the CUDA kernel is not in this build yet");
}
void fused_moe(Tensor&, const Tensor&, const MoeExperts&, const Tensor&, const Tensor&, Tensor*) {
  fail("fused_moe: the CUDA kernel is not in this build yet");
}
int64_t fused_moe_workspace_bytes(int64_t, int64_t, const MoeExperts&, DType) { return 0; }

}  // namespace atom::kernels::cuda
