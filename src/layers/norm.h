#pragma once

#include <string>

#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "layers/context.h"

namespace atom {

class RMSNorm {
 public:
  RMSNorm(LayerContext& ctx, const std::string& prefix, int64_t dim, double eps,
          kernels::RmsNormKind kind = kernels::RmsNormKind::kLlama);

  // x [rows, dim] -> normalised copy
  Tensor forward(Step& step, const Tensor& x);
  // Fused residual add: residual += x, returns norm(residual).
  Tensor forward(Step& step, const Tensor& x, Tensor& residual);
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
