// The feed-forward half of a decoder layer. A model file picks one per layer: the dense SwiGLU MLP
// of Llama-family models (GatedMlp), or a mixture of experts (layers/moe.h).
#pragma once

#include <string>

#include "kernels/activation.h"
#include "layers/linear.h"

namespace atom {

class FeedForward {
 public:
  virtual ~FeedForward() = default;
  // x [T, hidden] -> [T, hidden], into `out` when given (a caller-owned buffer), else a new step
  // tensor.
  virtual Tensor forward(Step& step, const Tensor& x, const Tensor& out = Tensor()) = 0;
};

// down(act(gate(x), up(x))), with gate and up fused; act is SiLU · up unless given
// (kernels::Glu: the clamped SwiGLU of GLM-5.3 and DeepSeek-V4, Kimi-K3's SiTU).
class GatedMlp : public FeedForward {
 public:
  // reduce_results = false leaves this rank's partial sum unreduced, for a caller that adds it to
  // other partial sums and reduces once (the shared experts beside a mixture of experts).
  GatedMlp(LayerContext& ctx, const std::string& prefix, int64_t hidden, int64_t intermediate,
           bool bias, bool reduce_results = true, const kernels::Glu& act = kernels::Glu());
  Tensor forward(Step& step, const Tensor& x, const Tensor& out = Tensor()) override;
  // The same on x as the op before wrote it (quantised for gate_up_proj: input_linear()).
  Tensor forward(Step& step, const LinearInput& x, const Tensor& out = Tensor());
  // The product that reads x, for an op before it that writes its quantised input; nullptr
  // unless set_fused_input_quant.
  const LinearBase* input_linear() const { return fuse_input_quant_ ? &gate_up_proj_ : nullptr; }
  void set_fused_input_quant(bool on) { fuse_input_quant_ = on; }
  // The spec's ATOM_LLAMA_ENABLE_AITER_TRITON_FUSED_SILU_MUL_QUANT: the activation written as
  // down_proj's FP8 input (kernels::glu_fp8) where down_proj quantises its input.
  void set_fused_act_quant(bool on) { fuse_act_quant_ = on; }

 private:
  LayerContext& ctx_;
  MergedColumnParallelLinear gate_up_proj_;  // hidden -> 2 * intermediate / tp
  RowParallelLinear down_proj_;              // intermediate / tp -> hidden (all-reduce)
  kernels::Glu act_;
  bool fuse_act_quant_ = false, fuse_input_quant_ = false;
};

}  // namespace atom
