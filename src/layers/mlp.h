// The SwiGLU MLP of Llama-family models: down(silu(gate(x)) * up(x)), with gate and up fused.
#pragma once

#include <string>

#include "layers/linear.h"

namespace atom {

class GatedMlp {
 public:
  GatedMlp(LayerContext& ctx, const std::string& prefix, int64_t hidden, int64_t intermediate,
           bool bias);
  // Into `out` [T, hidden] when given (LinearBase::forward), else a new step tensor.
  Tensor forward(Step& step, const Tensor& x, const Tensor& out = Tensor());

 private:
  LayerContext& ctx_;
  MergedColumnParallelLinear gate_up_proj_;  // hidden -> 2 * intermediate / tp
  RowParallelLinear down_proj_;              // intermediate / tp -> hidden (all-reduce)
};

}  // namespace atom
