#pragma once

#include <string>

#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "layers/context.h"
#include "layers/linear.h"

namespace atom {

class RMSNorm {
 public:
  RMSNorm(LayerContext& ctx, const std::string& prefix, int64_t dim, double eps,
          kernels::RmsNormKind kind = kernels::RmsNormKind::kLlama);

  // x [rows, dim] -> normalised copy
  Tensor forward(Step& step, const Tensor& x);
  // Fused residual add: residual += x, returns norm(residual).
  Tensor forward(Step& step, const Tensor& x, Tensor& residual);
  // The norm written as the FP8 input of `next`, the product after it (next.input_quant()
  // defined): one fused kernel where the backend has one for the shape, else the norm and the
  // quantisation; the same codes and scales either way. With `residual`: residual += x first, as
  // forward(step, x, residual).
  kernels::Fp8Input forward_fp8(Step& step, const Tensor& x, Tensor* residual,
                                const LinearBase& next);
  // Normalises each head_dim-wide group of x [rows, heads * dim] in place (per-head q/k norm).
  void forward_heads_inplace(Step& step, Tensor& x);
  // q's and k's per-head norms as one description, for RoPE to apply first (kernels/rope.h);
  // the two share eps and kind.
  static kernels::QkNorm heads(const RMSNorm& q_norm, const RMSNorm& k_norm);

 private:
  LayerContext& ctx_;
  int64_t dim_;
  float eps_;
  kernels::RmsNormKind kind_;
  Parameter* weight_;
};

}  // namespace atom
