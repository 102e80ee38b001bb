#include "layers/mlp.h"

#include "core/error.h"
#include "kernels/activation.h"
#include "kernels/linear_fp8.h"

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
  return forward(step, LinearInput(x), out);
}

Tensor GatedMlp::forward(Step& step, const LinearInput& x, const Tensor& out) {
  const int64_t rows = x.rows(), inter = gate_up_proj_.out_per_rank() / 2;
  if (fuse_act_quant_ && down_proj_.input_quant()) {
    Tensor gate_up = gate_up_proj_.forward(step, x);
    kernels::Fp8Input q = down_proj_.fp8_input(step, rows);
    if (!kernels::glu_fp8(q, gate_up, act_)) {
      Tensor act = step.empty({rows, inter}, ctx_.act_dtype);
      kernels::glu(act, gate_up, act_);
      kernels::quantize_fp8(q, act);
    }
    return down_proj_.forward(step, LinearInput(std::move(q)), out);
  }
  Tensor act = step.empty({rows, inter}, ctx_.act_dtype);
  // The fused GEMM epilogue computes plain SiLU · up only.
  if (x.quantised() || act_.kind != kernels::MoeActivation::kSiluMul ||
      !gate_up_proj_.forward_silu_mul(act, x.x)) {
    Tensor gate_up = gate_up_proj_.forward(step, x);
    kernels::glu(act, gate_up, act_);
  }
  return down_proj_.forward(step, act, out);
}

}  // namespace atom
