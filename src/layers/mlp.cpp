#include "layers/mlp.h"

#include "core/error.h"
#include "kernels/activation.h"

namespace atom {

GatedMlp::GatedMlp(LayerContext& ctx, const std::string& prefix, int64_t hidden,
                   int64_t intermediate, bool bias, bool reduce_results, const kernels::Glu& act)
    : ctx_(ctx),
      gate_up_proj_(ctx, prefix_join(prefix, "gate_up_proj"), hidden, {intermediate, intermediate},
                    bias),
      down_proj_(ctx, prefix_join(prefix, "down_proj"), intermediate, hidden, bias, reduce_results),
      act_(act) {
  kernels::glu_check(prefix.c_str(), act);
  if (intermediate <= 0)
    fail("{}: intermediate size {} (the config's 'intermediate_size' is missing or not positive)",
         prefix, intermediate);
}

Tensor GatedMlp::forward(Step& step, const Tensor& x, const Tensor& out) {
  Tensor act = step.empty({x.size(0), gate_up_proj_.out_per_rank() / 2}, ctx_.act_dtype);
  // The fused GEMM epilogue computes plain SiLU · up only.
  if (act_.kind != kernels::MoeActivation::kSiluMul || !gate_up_proj_.forward_silu_mul(act, x)) {
    Tensor gate_up = gate_up_proj_.forward(step, x);
    kernels::glu(act, gate_up, act_);
  }
  return down_proj_.forward(step, act, out);
}

}  // namespace atom
