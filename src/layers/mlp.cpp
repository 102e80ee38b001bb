#include "layers/mlp.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/activation.h"

namespace atom {

GatedMlp::GatedMlp(LayerContext& ctx, const std::string& prefix, int64_t hidden,
                   int64_t intermediate, bool bias, bool reduce_results, float swiglu_limit)
    : ctx_(ctx),
      gate_up_proj_(ctx, prefix_join(prefix, "gate_up_proj"), hidden, {intermediate, intermediate},
                    bias),
      down_proj_(ctx, prefix_join(prefix, "down_proj"), intermediate, hidden, bias, reduce_results),
      swiglu_limit_(swiglu_limit) {
  if (swiglu_limit > 0 && !ctx.device.is_cpu())
    fail("{}: the clamped SwiGLU (swiglu_limit {}) runs on the CPU backend only so far", prefix,
         swiglu_limit);
  if (intermediate <= 0)
    fail("{}: intermediate size {} (the config's 'intermediate_size' is missing or not positive)",
         prefix, intermediate);
}

Tensor GatedMlp::forward(Step& step, const Tensor& x, const Tensor& out) {
  Tensor act = step.empty({x.size(0), gate_up_proj_.out_per_rank() / 2}, ctx_.act_dtype);
  if (swiglu_limit_ > 0) {  // CPU: clamp gate (above) and up (both sides) in place first
    Tensor gate_up = gate_up_proj_.forward(step, x);
    ATOM_CHECK(
        gate_up.device().is_cpu() && gate_up.dtype() == DType::kF32 && gate_up.is_contiguous(),
        "clamped SwiGLU: {} must be contiguous F32 on the CPU", gate_up.str());
    const int64_t I = gate_up.size(1) / 2;
    for (int64_t r = 0; r < gate_up.size(0); ++r) {
      float* g = gate_up.ptr<float>() + r * 2 * I;
      for (int64_t i = 0; i < I; ++i) {
        g[i] = std::min(g[i], swiglu_limit_);
        g[I + i] = std::clamp(g[I + i], -swiglu_limit_, swiglu_limit_);
      }
    }
    kernels::silu_mul(act, gate_up);
  } else if (!gate_up_proj_.forward_silu_mul(act, x)) {
    Tensor gate_up = gate_up_proj_.forward(step, x);
    kernels::silu_mul(act, gate_up);
  }
  return down_proj_.forward(step, act, out);
}

}  // namespace atom
