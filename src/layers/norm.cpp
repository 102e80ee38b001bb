#include "layers/norm.h"

#include "core/error.h"

namespace atom {

RMSNorm::RMSNorm(LayerContext& ctx, const std::string& prefix, int64_t dim, double eps,
                 kernels::RmsNormKind kind)
    : ctx_(ctx), dim_(dim), eps_(static_cast<float>(eps)), kind_(kind) {
  weight_ =
      &ctx.params.add(prefix_join(prefix, "weight"), ctx.param_tensor({dim}, ctx.weight_dtype));
}

Tensor RMSNorm::forward(Step& step, const Tensor& x) {
  Tensor out = step.empty({x.size(0), dim_}, ctx_.act_dtype);
  kernels::rms_norm(out, x, nullptr, weight_->data(), eps_, kind_);
  return out;
}

Tensor RMSNorm::forward(Step& step, const Tensor& x, Tensor& residual) {
  ATOM_CHECK(residual.defined(), "rms_norm: the residual stream is undefined");
  Tensor out = step.empty({x.size(0), dim_}, ctx_.act_dtype);
  kernels::rms_norm(out, x, &residual, weight_->data(), eps_, kind_);
  return out;
}

kernels::Fp8Input RMSNorm::forward_fp8(Step& step, const Tensor& x, Tensor* residual,
                                       const LinearBase& next) {
  ATOM_CHECK(!residual || residual->defined(), "rms_norm: the residual stream is undefined");
  kernels::Fp8Input in = next.fp8_input(step, x.size(0));
  if (!kernels::rms_norm_fp8(in, x, residual, weight_->data(), eps_, kind_)) {
    Tensor y = residual ? forward(step, x, *residual) : forward(step, x);
    kernels::quantize_fp8(in, y);
  }
  return in;
}

kernels::QkNorm RMSNorm::heads(const RMSNorm& q_norm, const RMSNorm& k_norm) {
  ATOM_CHECK(
      q_norm.eps_ == k_norm.eps_ && q_norm.kind_ == k_norm.kind_ && q_norm.dim_ == k_norm.dim_,
      "q and k norms differ in eps, kind or width");
  return {&q_norm.weight_->data(), &k_norm.weight_->data(), q_norm.eps_, q_norm.kind_};
}

void RMSNorm::forward_heads_inplace(Step& step, Tensor& x) {
  ATOM_CHECK(x.dim() == 2 && x.size(1) % dim_ == 0, "per-head norm of {} over {}", x.str(), dim_);
  kernels::rms_norm(x, x, nullptr, weight_->data(), eps_, kind_);
}

}  // namespace atom
