// The feed-forward half of a decoder layer. A model file picks one per layer: the dense SwiGLU MLP
// of Llama-family models (GatedMlp), or a mixture of experts (layers/moe.h).
#pragma once

#include <string>

#include "layers/linear.h"

namespace atom {

class FeedForward {
 public:
  virtual ~FeedForward() = default;
  // x [T, hidden] -> [T, hidden], into `out` when given (a caller-owned buffer), else a new step
  // tensor.
  virtual Tensor forward(Step& step, const Tensor& x, const Tensor& out = Tensor()) = 0;
};

// down(silu(gate(x)) * up(x)), with gate and up fused.
class GatedMlp : public FeedForward {
 public:
  // reduce_results = false leaves this rank's partial sum unreduced, for a caller that adds it to
  // other partial sums and reduces once (the shared experts beside a mixture of experts).
  // swiglu_limit > 0: the clamped form silu(min(gate, limit)) * clamp(up, -limit, limit)
  // (GLM-5.3, DeepSeek-V4).
  GatedMlp(LayerContext& ctx, const std::string& prefix, int64_t hidden, int64_t intermediate,
           bool bias, bool reduce_results = true, float swiglu_limit = 0.0f);
  Tensor forward(Step& step, const Tensor& x, const Tensor& out = Tensor()) override;

 private:
  LayerContext& ctx_;
  MergedColumnParallelLinear gate_up_proj_;  // hidden -> 2 * intermediate / tp
  RowParallelLinear down_proj_;              // intermediate / tp -> hidden (all-reduce)
  float swiglu_limit_ = 0.0f;
};

}  // namespace atom
