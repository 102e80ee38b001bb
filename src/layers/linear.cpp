#include "layers/linear.h"

#include "core/convert.h"
#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"

namespace atom {

void param_load_rows(Parameter& p, const Tensor& ckpt, int64_t src_row, int64_t dst_row,
                     int64_t rows, int64_t expect_ckpt_rows) {
  Tensor& dst = p.data();
  Shape want = dst.shape();
  want[0] = expect_ckpt_rows;
  param_check_shape(p, ckpt, want, "");
  ATOM_CHECK(src_row + rows <= ckpt.size(0) && dst_row + rows <= dst.size(0),
             "row slice out of range loading '{}'", p.name());
  Tensor d = dst.narrow(0, dst_row, rows);
  tensor_assign(d, ckpt.narrow(0, src_row, rows));
}

namespace {
void check_divisible(const std::string& prefix, const char* what, int64_t n, int tp) {
  if (n % tp != 0)
    fail("{}: {} ({}) is not divisible by the tensor-parallel size {}", prefix, what, n, tp);
}
}  // namespace

Tensor LinearBase::output(Step& step, const Tensor& x, const Tensor& out) const {
  if (!out.defined()) return step.empty({x.size(0), out_}, ctx_.act_dtype);
  ATOM_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == out_ &&
                 out.dtype() == ctx_.act_dtype && out.is_contiguous(),
             "linear: output {} for input {} must be contiguous [{}, {}] of {}", out.str(), x.str(),
             x.size(0), out_, dtype_name(ctx_.act_dtype));
  return out;
}

bool LinearBase::forward_silu_mul(Tensor& out, const Tensor& x) {
  return kernels::linear_silu_mul(out, x, weight_->data(), bias_ ? bias_->data() : Tensor());
}

bool LinearBase::forward_rope_kv(Tensor& out, const Tensor& x, const kernels::QkvRope& r) {
  return kernels::linear_rope_kv(out, x, weight_->data(), bias_ ? bias_->data() : Tensor(), r);
}

Tensor LinearBase::forward(Step& step, const Tensor& x, const Tensor& out) {
  Tensor y = output(step, x, out);
  kernels::linear(y, x, weight_->data(), bias_ ? bias_->data() : Tensor(), hints_);
  return y;
}

ReplicatedLinear::ReplicatedLinear(LayerContext& ctx, const std::string& prefix, int64_t in,
                                   int64_t out, bool bias)
    : LinearBase(ctx, in, out) {
  weight_ =
      &ctx.params.add(prefix_join(prefix, "weight"), ctx.param_tensor({out, in}, ctx.weight_dtype));
  if (bias)
    bias_ = &ctx.params.add(prefix_join(prefix, "bias"), ctx.param_tensor({out}, ctx.weight_dtype));
}

ColumnParallelLinear::ColumnParallelLinear(LayerContext& ctx, int64_t in, int64_t out_per_rank)
    : LinearBase(ctx, in, out_per_rank) {}

ColumnParallelLinear::ColumnParallelLinear(LayerContext& ctx, const std::string& prefix, int64_t in,
                                           int64_t out, bool bias)
    : LinearBase(ctx, in, out / ctx.tp_size) {
  check_divisible(prefix, "output size", out, ctx.tp_size);
  const int64_t per = out_, start = ctx.tp_rank * per;
  auto loader = [per, start, out](Parameter& p, const Tensor& ckpt, const std::string&, int) {
    param_load_rows(p, ckpt, start, 0, per, out);
  };
  weight_ = &ctx.params.add(prefix_join(prefix, "weight"),
                            ctx.param_tensor({per, in}, ctx.weight_dtype), loader);
  if (bias)
    bias_ = &ctx.params.add(prefix_join(prefix, "bias"), ctx.param_tensor({per}, ctx.weight_dtype),
                            loader);
}

RowParallelLinear::RowParallelLinear(LayerContext& ctx, const std::string& prefix, int64_t in,
                                     int64_t out, bool bias, bool reduce_results)
    : LinearBase(ctx, in / ctx.tp_size, out), reduce_(reduce_results) {
  check_divisible(prefix, "input size", in, ctx.tp_size);
  const int64_t per = in_, start = ctx.tp_rank * per;
  auto loader = [per, start, in, out](Parameter& p, const Tensor& ckpt, const std::string&, int) {
    param_check_shape(p, ckpt, {out, in}, "");
    Tensor& d = p.data();
    tensor_assign(d, ckpt.narrow(1, start, per));
  };
  weight_ = &ctx.params.add(prefix_join(prefix, "weight"),
                            ctx.param_tensor({out, per}, ctx.weight_dtype), loader);
  if (bias)
    bias_ = &ctx.params.add(prefix_join(prefix, "bias"), ctx.param_tensor({out}, ctx.weight_dtype));
}

Tensor RowParallelLinear::forward(Step& step, const Tensor& x, const Tensor& out) {
  Tensor y = output(step, x, out);
  if (ctx_.tp_size == 1 || !reduce_) {
    kernels::linear(y, x, weight_->data(), bias_ ? bias_->data() : Tensor(), hints_);
    return y;
  }
  kernels::linear(y, x, weight_->data(), Tensor(), hints_);
  ctx_.comm->all_reduce_sum(y);
  if (bias_) kernels::add_bias(y, bias_->data());
  return y;
}

QKVParallelLinear::QKVParallelLinear(LayerContext& ctx, const std::string& prefix, int64_t hidden,
                                     int64_t head_dim, int64_t total_heads, int64_t total_kv_heads,
                                     bool bias)
    : ColumnParallelLinear(ctx, hidden, 0), head_dim_(head_dim) {
  const int tp = ctx.tp_size;
  check_divisible(prefix, "number of attention heads", total_heads, tp);
  heads_ = total_heads / tp;
  if (total_kv_heads >= tp) {
    check_divisible(prefix, "number of key/value heads", total_kv_heads, tp);
    kv_heads_ = total_kv_heads / tp;
    kv_replicas_ = 1;
  } else {
    if (tp % total_kv_heads != 0)
      fail("{}: tensor-parallel size {} is not a multiple of the {} key/value heads", prefix, tp,
           total_kv_heads);
    kv_heads_ = 1;
    kv_replicas_ = tp / total_kv_heads;
  }
  out_ = (heads_ + 2 * kv_heads_) * head_dim;
  const int64_t q_rows = heads_ * head_dim, kv_rows = kv_heads_ * head_dim;
  const int64_t q_total = total_heads * head_dim, kv_total = total_kv_heads * head_dim;
  const int64_t q_start = ctx.tp_rank * q_rows;
  const int64_t kv_start = (ctx.tp_rank / kv_replicas_) * kv_rows;
  auto loader = [=](Parameter& p, const Tensor& ckpt, const std::string& shard, int) {
    if (shard == "q") return param_load_rows(p, ckpt, q_start, 0, q_rows, q_total);
    if (shard == "k") return param_load_rows(p, ckpt, kv_start, q_rows, kv_rows, kv_total);
    if (shard == "v")
      return param_load_rows(p, ckpt, kv_start, q_rows + kv_rows, kv_rows, kv_total);
    fail("parameter '{}' takes parts q, k and v, not '{}'", p.name(), shard);
  };
  weight_ =
      &ctx.params.add(prefix_join(prefix, "weight"),
                      ctx.param_tensor({out_, hidden}, ctx.weight_dtype), loader, {"q", "k", "v"});
  if (bias)
    bias_ = &ctx.params.add(prefix_join(prefix, "bias"), ctx.param_tensor({out_}, ctx.weight_dtype),
                            loader, {"q", "k", "v"});
}

MergedColumnParallelLinear::MergedColumnParallelLinear(LayerContext& ctx, const std::string& prefix,
                                                       int64_t in,
                                                       std::vector<int64_t> output_sizes, bool bias)
    : ColumnParallelLinear(ctx, in, 0), sizes_(std::move(output_sizes)) {
  std::vector<std::string> parts;
  std::vector<int64_t> offsets;
  out_ = 0;
  for (size_t i = 0; i < sizes_.size(); ++i) {
    check_divisible(prefix, "output size", sizes_[i], ctx.tp_size);
    offsets.push_back(out_);
    out_ += sizes_[i] / ctx.tp_size;
    parts.push_back(std::to_string(i));
  }
  const auto sizes = sizes_;
  const int tp = ctx.tp_size, rank = ctx.tp_rank;
  auto loader = [sizes, offsets, tp, rank](Parameter& p, const Tensor& ckpt,
                                           const std::string& shard, int) {
    size_t i = 0;
    try {
      i = std::stoul(shard);
    } catch (...) {
      fail("parameter '{}' takes numbered parts, not '{}'", p.name(), shard);
    }
    if (i >= sizes.size()) fail("parameter '{}' has no part {}", p.name(), shard);
    const int64_t per = sizes[i] / tp;
    param_load_rows(p, ckpt, rank * per, offsets[i], per, sizes[i]);
  };
  weight_ = &ctx.params.add(prefix_join(prefix, "weight"),
                            ctx.param_tensor({out_, in}, ctx.weight_dtype), loader, parts);
  if (bias)
    bias_ = &ctx.params.add(prefix_join(prefix, "bias"), ctx.param_tensor({out_}, ctx.weight_dtype),
                            loader, parts);
}

}  // namespace atom
