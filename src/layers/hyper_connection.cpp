#include "layers/hyper_connection.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "kernels/hyper_connection.h"

namespace atom {

namespace {

void check_streams(const Tensor& x, const HyperConnectionOptions& o, const char* what) {
  ATOM_CHECK(x.dtype() == DType::kF32 && x.is_contiguous() && x.dim() == 3 &&
                 x.size(1) == o.hc_mult && x.size(2) == o.hidden,
             "{}: streams {} must be contiguous F32 [T, {}, {}]", what, x.str(), o.hc_mult,
             o.hidden);
}

kernels::HcArgs hc_args(const HyperConnectionOptions& o) {
  kernels::HcArgs a;
  a.hc = o.hc_mult;
  a.sinkhorn_iters = o.sinkhorn_iters;
  a.hc_eps = o.hc_eps;
  a.norm_eps = o.norm_eps;
  return a;
}

}  // namespace

HyperConnection::HyperConnection(LayerContext& ctx, const std::string& fn, const std::string& base,
                                 const std::string& scale, const HyperConnectionOptions& o)
    : o_(o), act_dtype_(ctx.act_dtype) {
  const int64_t hc = o.hc_mult, mix = (2 + hc) * hc;
  ATOM_CHECK(hc >= 1 && o.hidden >= 1 && o.sinkhorn_iters >= 1,
             "{}: hyper-connections need hc_mult >= 1 and hc_sinkhorn_iters >= 1 (got {}, {})", fn,
             hc, o.sinkhorn_iters);
#ifdef ATOM_HAVE_CUDA
  if (!ctx.device.is_cpu() && hc > kernels::cuda::kHcMaxStreams)
    fail("{}: hc_mult {}: the CUDA hyper-connection kernels take up to {} streams", fn, hc,
         kernels::cuda::kHcMaxStreams);
#endif
  fn_ = &ctx.params.add(fn, ctx.param_tensor({mix, hc * o.hidden}, DType::kF32));
  base_ = &ctx.params.add(base, ctx.param_tensor({mix}, DType::kF32));
  scale_ = &ctx.params.add(scale, ctx.param_tensor({3}, DType::kF32));
}

HyperConnection::Mix HyperConnection::mix(Step& step, const Tensor& x,
                                          const Tensor* carried) const {
  check_streams(x, o_, "hyper-connection");
  const int64_t T = x.size(0), hc = o_.hc_mult, D = o_.hidden;
  Mix m{step.empty({T, D}, act_dtype_), step.empty({T, hc}, DType::kF32),
        step.empty({T, hc, hc}, DType::kF32), Tensor()};
  kernels::HcCarry c;
  if (carried) {
    m.pre = step.empty({T, hc}, DType::kF32);
    c.by = carried;
    c.pre_out = &m.pre;
  }
  kernels::hc_mix(m.input, m.post, m.comb, x, fn_->data(), base_->data(), scale_->data(),
                  hc_args(o_), c);
  return m;
}

void HyperConnection::write_back(const Mix& m, const Tensor& y, Tensor& x) {
  kernels::hc_write_back(x, y, m.post, m.comb);
}

Tensor HyperConnection::collapse(Step& step, const Tensor& x, const Tensor& pre, DType dtype) {
  Tensor out = step.empty({x.size(0), x.size(2)}, dtype);
  kernels::hc_collapse(out, x, pre);
  return out;
}

Tensor hc_streams_from_embedding(Step& step, const Tensor& e, int64_t hc) {
  ATOM_CHECK(e.dim() == 2, "hyper-connections: embeddings {} must be [T, D]", e.str());
  Tensor streams = step.empty({e.size(0), hc, e.size(1)}, DType::kF32);
  kernels::hc_expand(streams, e);
  return streams;
}

Tensor hc_streams_from_stage(Step& step, int64_t hc, int64_t hidden) {
  const Tensor* in = step.pp_in ? &step.pp_in->hidden : nullptr;
  ATOM_CHECK(in && in->defined() && in->dim() == 3 && in->size(0) == step.batch.num_tokens() &&
                 in->size(1) == hc && in->size(2) == hidden && in->dtype() == DType::kF32,
             "hyper-connections: the previous pipeline stage handed on {}, not the [{}, {}, {}] "
             "F32 streams",
             in && in->defined() ? in->str() : std::string("nothing"), step.batch.num_tokens(), hc,
             hidden);
  return *in;
}

HyperHead::HyperHead(LayerContext& ctx, const std::string& fn, const std::string& base,
                     const std::string& scale, const HyperConnectionOptions& o)
    : o_(o), act_dtype_(ctx.act_dtype) {
  const int64_t hc = o.hc_mult;
  fn_ = &ctx.params.add(fn, ctx.param_tensor({hc, hc * o.hidden}, DType::kF32));
  base_ = &ctx.params.add(base, ctx.param_tensor({hc}, DType::kF32));
  scale_ = &ctx.params.add(scale, ctx.param_tensor({1}, DType::kF32));
}

HyperHead::HyperHead(LayerContext& ctx, const HyperConnectionOptions& o)
    : o_(o), act_dtype_(ctx.act_dtype) {}

Tensor HyperHead::forward(Step& step, const Tensor& x) const {
  check_streams(x, o_, "hyper-connection head");
  Tensor out = step.empty({x.size(0), o_.hidden}, act_dtype_);
  kernels::hc_head(out, x, fn_ ? fn_->data() : Tensor(), base_ ? base_->data() : Tensor(),
                   scale_ ? scale_->data() : Tensor(), hc_args(o_));
  return out;
}

}  // namespace atom
