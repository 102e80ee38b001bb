#include "layers/linear.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>

#include "core/convert.h"
#include "core/error.h"
#include "core/half.h"
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

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The shape a checkpoint scale of `q` has for a [N, K] weight (kChannel: [N] or [N, 1]; kTensor:
// [] or [1]).
bool scale_shape_ok(const Tensor& s, int64_t N, int64_t K, const LinearQuant& q) {
  switch (q.scales) {
    case Fp8Scales::kBlock:
      return s.dim() == 2 && s.size(0) == ceil_div(N, q.block_n) &&
             s.size(1) == ceil_div(K, q.block_k);
    case Fp8Scales::kChannel:
      return (s.dim() == 1 && s.size(0) == N) || (s.dim() == 2 && s.size(0) == N && s.size(1) == 1);
    case Fp8Scales::kTensor:
      return s.numel() == 1 && s.dim() <= 1;
  }
  return false;
}

std::string scale_shape_want(int64_t N, int64_t K, const LinearQuant& q) {
  switch (q.scales) {
    case Fp8Scales::kBlock:
      return fmt::format("[{}, {}] (a [{}, {}] weight in {}x{} blocks)", ceil_div(N, q.block_n),
                         ceil_div(K, q.block_k), N, K, q.block_n, q.block_k);
    case Fp8Scales::kChannel:
      return fmt::format("[{}] or [{}, 1] (per channel)", N, N);
    case Fp8Scales::kTensor:
      return "[] or [1] (per tensor)";
  }
  return "";
}

Tensor full_f32(int64_t n, float v) {
  Tensor t = Tensor::empty({n}, DType::kF32);
  std::fill(t.ptr<float>(), t.ptr<float>() + n, v);
  return t;
}

// A CPU F32 copy of a checkpoint scale (F32, BF16 or F16 as checkpoints ship them, or F8_E8M0
// exponents b, 2^(b - 127): DeepSeek's ue8m0 scale_fmt).
Tensor scale_f32(const Tensor& s, const std::string& what) {
  if (s.dtype() == DType::kE8M0) {
    const Tensor c = s.to(Device::cpu()).contiguous();
    Tensor out = Tensor::empty(c.shape(), DType::kF32);
    const uint8_t* b = static_cast<const uint8_t*>(c.data());
    for (int64_t i = 0; i < c.numel(); ++i) {
      if (b[i] == 0xFF) fail("{}: E8M0 scale {} is NaN (0xFF)", what, i);
      out.ptr<float>()[i] = std::ldexp(1.0f, static_cast<int>(b[i]) - 127);
    }
    return out;
  }
  if (s.dtype() != DType::kF32 && s.dtype() != DType::kBF16 && s.dtype() != DType::kF16)
    fail("{}: scale is {}, expected F32 (or BF16/F16, or F8_E8M0 exponents)", what,
         dtype_name(s.dtype()));
  return tensor_cast_cpu(s, DType::kF32);
}
}  // namespace

Tensor fp8_scale_to_f32(const Tensor& scale, const std::string& what) {
  return scale_f32(scale, what);
}

void fp8_check_weight(const Tensor& w, int64_t N, int64_t K, const std::string& what) {
  if (w.dtype() != DType::kF8E4M3)
    fail("{}: the quantization_config stores this layer as FP8, but the checkpoint weight is {} "
         "{}, not F8_E4M3",
         what, dtype_name(w.dtype()), shape_str(w.shape()));
  if (w.dim() != 2 || w.size(0) != N || w.size(1) != K)
    fail("{}: FP8 weight has shape {}, expected [{}, {}]", what, shape_str(w.shape()), N, K);
}

void fp8_check_scale(const Tensor& s, int64_t N, int64_t K, const LinearQuant& q,
                     const std::string& what) {
  if (!scale_shape_ok(s, N, K, q))
    fail("{}: weight scale has shape {}, expected {} for {}", what, shape_str(s.shape()),
         scale_shape_want(N, K, q), q.str());
}

Tensor fp8_dequantize(const Tensor& w, const Tensor& scale, const LinearQuant& q,
                      const std::string& what) {
  ATOM_CHECK(w.dim() == 2, "{}: FP8 weight {} is not 2-D", what, w.str());
  const int64_t N = w.size(0), K = w.size(1);
  fp8_check_weight(w, N, K, what);
  fp8_check_scale(scale, N, K, q, what);
  const Tensor wc = w.contiguous();
  const Tensor s = scale_f32(scale, what).contiguous();
  Tensor out = Tensor::empty({N, K}, DType::kF32);
  const uint8_t* wp = static_cast<const uint8_t*>(wc.data());
  const float* sp = s.ptr<float>();
  float* op = out.ptr<float>();
  const int64_t grid_k = q.scales == Fp8Scales::kBlock ? ceil_div(K, q.block_k) : 0;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      float sc = sp[0];
      if (q.scales == Fp8Scales::kChannel) sc = sp[n];
      if (q.scales == Fp8Scales::kBlock) sc = sp[(n / q.block_n) * grid_k + k / q.block_k];
      op[n * K + k] = f8e4m3_to_f32(wp[n * K + k]) * sc;
    }
  }
  return out;
}

LinearQuant linear_quant_for(const LayerContext& ctx, const std::string& prefix,
                             const std::vector<std::string>& shards,
                             std::vector<std::string>* ckpt_names) {
  // A part's checkpoint module: the packed module feeding this layer's last component as that
  // shard (qkv_proj part q <- q_proj), else the layer's own name.
  const size_t dot = prefix.rfind('.');
  const std::string head = dot == std::string::npos ? "" : prefix.substr(0, dot + 1);
  const std::string last = dot == std::string::npos ? prefix : prefix.substr(dot + 1);
  std::vector<std::string> names;
  for (const auto& shard : shards) {
    std::string name = prefix;
    if (!shard.empty())
      for (const auto& pm : ctx.packed_modules)
        if (pm.param == last && pm.shard == shard) name = head + pm.ckpt;
    names.push_back(name);
  }
  if (ckpt_names) *ckpt_names = names;
  if (!ctx.quant) return {};
  return ctx.quant->linear_fused(prefix, names);
}

kernels::Fp8Weight LinearBase::fp8_weight() const {
  ATOM_CHECK(fp8_, "linear: the weight of '{}' is not stored as FP8", weight_->name());
  kernels::Fp8Weight w;
  w.w = weight_->data();
  w.scale = weight_scale_->data();
  switch (quant_.scales) {
    case Fp8Scales::kBlock:
      w.granularity = kernels::Fp8Granularity::kBlock;
      break;
    case Fp8Scales::kChannel:
      w.granularity = kernels::Fp8Granularity::kChannel;
      break;
    case Fp8Scales::kTensor:
      w.granularity = w.scale.numel() == 1 ? kernels::Fp8Granularity::kTensor
                                           : kernels::Fp8Granularity::kChannel;
      break;
  }
  w.block_n = quant_.block_n;
  w.block_k = quant_.block_k;
  switch (quant_.inputs) {
    case Fp8Inputs::kBlockDynamic:
      w.activation = kernels::Fp8Activation::kBlockDynamic;
      break;
    case Fp8Inputs::kTokenDynamic:
      w.activation = kernels::Fp8Activation::kTokenDynamic;
      break;
    case Fp8Inputs::kTensorStatic:
      w.activation = kernels::Fp8Activation::kTensorStatic;
      w.input_scale = input_scale_->data();
      break;
    case Fp8Inputs::kNone:
      w.activation = kernels::Fp8Activation::kNone;
      break;
  }
  return w;
}

namespace {
// An FP8 part's weight and scale arrive as two tensors, in either order and on any loader
// thread: the first is kept until its partner comes (per part).
struct Fp8Pairs {
  std::mutex mu;
  Parameter* weight = nullptr;                             // where the dequantised parts go
  std::map<std::string, std::pair<Tensor, Tensor>> parts;  // shard -> (weight, scale), copies
  // Returns both once the second has arrived (and forgets them), else undefined tensors.
  std::pair<Tensor, Tensor> add(const std::string& shard, const Tensor& t, bool is_weight) {
    std::lock_guard<std::mutex> lock(mu);
    auto& [w, s] = parts[shard];
    (is_weight ? w : s) = t.clone();
    if (!w.defined() || !s.defined()) return {};
    auto r = std::make_pair(w, s);
    parts.erase(shard);
    return r;
  }
};
}  // namespace

void LinearBase::init_params(const std::string& prefix, LinearLayout layout, bool bias,
                             LinearStorage storage) {
  std::vector<std::string> shards, names;
  for (const auto& p : layout.parts) shards.push_back(p.shard);
  if (storage != LinearStorage::kUnquantized)
    quant_ = linear_quant_for(ctx_, prefix, shards, &names);
  for (size_t i = 0; i < layout.parts.size(); ++i)
    layout.parts[i].ckpt_name = names.empty() ? prefix : names[i];
  fp8_ = quant_.fp8 && storage == LinearStorage::kAuto && ctx_.fp8_resident;
  if (fp8_ && quant_.scales == Fp8Scales::kBlock) {
    // A tensor-parallel cut must fall on the checkpoint's scale blocks (a partial block only at
    // a tensor's end), or this rank's rows would need scales the grid does not have.
    const int bn = quant_.block_n, bk = quant_.block_k;
    for (const auto& part : layout.parts)
      if (part.src_row % bn || (part.rows % bn && part.src_row + part.rows != part.ckpt_rows))
        fail("{}: {}rows [{}, {}) of {} on this rank (tensor-parallel size {}) do not fall on "
             "the {}-row scale blocks of {}",
             prefix, part.shard.empty() ? "" : "part " + part.shard + " ", part.src_row,
             part.src_row + part.rows, part.ckpt_name, ctx_.tp_size, bn, quant_.str());
    if (layout.col_start % bk ||
        (layout.cols % bk && layout.col_start + layout.cols != layout.ckpt_cols))
      fail("{}: columns [{}, {}) on this rank (tensor-parallel size {}) do not fall on the "
           "{}-column scale blocks of {}",
           prefix, layout.col_start, layout.col_start + layout.cols, ctx_.tp_size, bk,
           quant_.str());
    // Fused parts that do not meet on a block boundary (a gate part narrower than a block) cannot
    // share one grid: such a layer is dequantised at load instead.
    for (const auto& part : layout.parts)
      if (part.dst_row % bn || (part.rows % bn && part.dst_row + part.rows != out_)) fp8_ = false;
  }
  const auto L = std::make_shared<const LinearLayout>(std::move(layout));
  // The cuts of checkpoint part `shard` (one, or a grouped layer's several).
  auto find_part = [L](const Parameter& p, const std::string& shard) {
    std::vector<const LinearLayout::Part*> cuts;
    for (const auto& part : L->parts)
      if (part.shard == shard) cuts.push_back(&part);
    if (cuts.empty()) {
      std::string list;
      for (const auto& part : L->parts) list += (list.empty() ? "'" : ", '") + part.shard + "'";
      fail("parameter '{}' takes parts {}, not '{}'", p.name(), list, shard);
    }
    return cuts;
  };
  std::vector<std::string> parts;
  for (const auto& part : L->parts)
    if (std::find(parts.begin(), parts.end(), part.shard) == parts.end())
      parts.push_back(part.shard);

  // A dense part (any float dtype): rows of the part, this rank's columns.
  auto write_dense = [L](Parameter& p, const Tensor& ckpt,
                         const std::vector<const LinearLayout::Part*>& cuts) {
    const auto& first = *cuts[0];
    param_check_shape(p, ckpt, {first.ckpt_rows, L->ckpt_cols},
                      first.shard.empty() ? "" : "part " + first.shard);
    for (const auto* part : cuts) {
      Tensor d = p.data().narrow(0, part->dst_row, part->rows);
      tensor_assign(d, ckpt.narrow(0, part->src_row, part->rows).narrow(1, L->col_start, L->cols));
    }
  };
  const std::string w_name = prefix_join(prefix, "weight");
  const LinearQuant q = quant_;
  if (!quant_.fp8) {
    weight_ = &ctx_.params.add(
        w_name, ctx_.param_tensor({out_, L->cols}, ctx_.weight_dtype),
        [find_part, write_dense](Parameter& p, const Tensor& ckpt, const std::string& shard, int) {
          write_dense(p, ckpt, find_part(p, shard));
        },
        parts);
  } else if (!fp8_) {
    // Dequantised at load: each part's weight waits for its scale (or the scale for the weight).
    // fp32 on the CPU reference (a dequantised FP8 weight is rarely a BF16 value), the weight
    // dtype elsewhere.
    auto pairs = std::make_shared<Fp8Pairs>();
    auto arrive = [pairs, find_part, write_dense, q, L](Parameter& p, const Tensor& ckpt,
                                                        const std::string& shard, bool is_weight) {
      const auto cuts = find_part(p, shard);
      const LinearLayout::Part& part = *cuts[0];
      const std::string what = part.ckpt_name;
      if (is_weight)
        fp8_check_weight(ckpt, part.ckpt_rows, L->ckpt_cols, what);
      else
        fp8_check_scale(ckpt, part.ckpt_rows, L->ckpt_cols, q, what);
      auto [w, s] = pairs->add(shard, ckpt, is_weight);
      if (!w.defined()) return;
      write_dense(*pairs->weight, fp8_dequantize(w, s, q, what), cuts);
    };
    weight_ = &ctx_.params.add(
        w_name, ctx_.param_tensor({out_, L->cols}, fp8_dequantized_dtype(ctx_)),
        [arrive](Parameter& p, const Tensor& ckpt, const std::string& shard, int) {
          arrive(p, ckpt, shard, true);
        },
        parts);
    pairs->weight = weight_;
    weight_scale_ = &ctx_.params.add(
        prefix_join(prefix, "weight_scale"), ctx_.param_tensor({1}, DType::kF32),
        [arrive](Parameter& p, const Tensor& ckpt, const std::string& shard, int) {
          arrive(p, ckpt, shard, false);
        },
        parts);
  } else {
    // Resident FP8: the weight's bytes, and the scale grid cut at the same rows and columns.
    weight_ = &ctx_.params.add(
        w_name, ctx_.param_tensor({out_, L->cols}, DType::kF8E4M3),
        [find_part, L](Parameter& p, const Tensor& ckpt, const std::string& shard, int) {
          const auto cuts = find_part(p, shard);
          fp8_check_weight(ckpt, cuts[0]->ckpt_rows, L->ckpt_cols, cuts[0]->ckpt_name);
          for (const auto* part : cuts) {
            Tensor d = p.data().narrow(0, part->dst_row, part->rows);
            tensor_assign(
                d, ckpt.narrow(0, part->src_row, part->rows).narrow(1, L->col_start, L->cols));
          }
        },
        parts);
    Shape scale_shape{1};
    const bool expand = q.scales == Fp8Scales::kTensor && L->parts.size() > 1;
    if (q.scales == Fp8Scales::kBlock) {
      scale_shape = {ceil_div(out_, q.block_n), ceil_div(L->cols, q.block_k)};
    } else if (q.scales == Fp8Scales::kChannel || expand) {
      scale_shape = {out_};
    }
    weight_scale_ = &ctx_.params.add(
        prefix_join(prefix, "weight_scale"), ctx_.param_tensor(scale_shape, DType::kF32),
        [find_part, L, q, expand](Parameter& p, const Tensor& ckpt, const std::string& shard, int) {
          const auto cuts = find_part(p, shard);
          fp8_check_scale(ckpt, cuts[0]->ckpt_rows, L->ckpt_cols, q, cuts[0]->ckpt_name);
          const Tensor s = scale_f32(ckpt, cuts[0]->ckpt_name);
          Tensor& d = p.data();
          for (const auto* c : cuts) {
            const LinearLayout::Part& part = *c;
            if (q.scales == Fp8Scales::kBlock) {
              const int64_t r0 = part.src_row / q.block_n, c0 = L->col_start / q.block_k;
              const int64_t rn = ceil_div(part.src_row + part.rows, q.block_n) - r0;
              const int64_t cn = ceil_div(L->col_start + L->cols, q.block_k) - c0;
              Tensor dst = d.narrow(0, part.dst_row / q.block_n, rn);
              tensor_assign(dst, s.narrow(0, r0, rn).narrow(1, c0, cn));
            } else if (q.scales == Fp8Scales::kChannel) {
              Tensor dst = d.narrow(0, part.dst_row, part.rows);
              tensor_assign(dst, s.view({part.ckpt_rows}).narrow(0, part.src_row, part.rows));
            } else if (expand) {  // exact: each row keeps its part's scale
              Tensor dst = d.narrow(0, part.dst_row, part.rows);
              tensor_assign(dst, full_f32(part.rows, s.ptr<float>()[0]));
            } else {
              tensor_assign(d, s.view({1}));
            }
          }
        },
        parts);
  }
  if (quant_.fp8 && quant_.inputs == Fp8Inputs::kTensorStatic) {
    // One static scale for the fused layer's activations: the largest of its parts' (vLLM's
    // choice); the CPU reference does not quantise activations and only checks it.
    auto mu = std::make_shared<std::mutex>();
    input_scale_ = &ctx_.params.add(
        prefix_join(prefix, "input_scale"), ctx_.param_tensor({1}, DType::kF32),
        [find_part, mu](Parameter& p, const Tensor& ckpt, const std::string& shard, int) {
          const LinearLayout::Part& part = *find_part(p, shard)[0];
          if (ckpt.numel() != 1 || ckpt.dim() > 1)
            fail("{}: input_scale has shape {}, expected [] or [1] (static per-tensor "
                 "activations)",
                 part.ckpt_name, shape_str(ckpt.shape()));
          const float v = scale_f32(ckpt, part.ckpt_name).ptr<float>()[0];
          if (!(v > 0)) fail("{}: input_scale {} is not positive", part.ckpt_name, v);
          std::lock_guard<std::mutex> lock(*mu);
          const float old = tensor_cast_cpu(p.data(), DType::kF32).ptr<float>()[0];
          Tensor d = p.data();
          tensor_assign(d, full_f32(1, std::max(old, v)));
        },
        parts);
  }
  if (bias) {
    bias_ = &ctx_.params.add(
        prefix_join(prefix, "bias"), ctx_.param_tensor({out_}, ctx_.weight_dtype),
        [find_part](Parameter& p, const Tensor& ckpt, const std::string& shard, int) {
          const auto cuts = find_part(p, shard);
          param_check_shape(p, ckpt, {cuts[0]->ckpt_rows}, shard.empty() ? "" : "part " + shard);
          for (const auto* part : cuts) {
            Tensor d = p.data().narrow(0, part->dst_row, part->rows);
            tensor_assign(d, ckpt.narrow(0, part->src_row, part->rows));
          }
        },
        parts);
  }
}

Tensor LinearBase::output(Step& step, int64_t rows, const Tensor& out) const {
  if (!out.defined()) return step.empty({rows, out_}, ctx_.act_dtype);
  ATOM_CHECK(out.dim() == 2 && out.size(0) == rows && out.size(1) == out_ &&
                 out.dtype() == ctx_.act_dtype && out.is_contiguous(),
             "linear: output {} for {} input rows must be contiguous [{}, {}] of {}", out.str(),
             rows, rows, out_, dtype_name(ctx_.act_dtype));
  return out;
}

void LinearBase::finish(Tensor& y) {
  if (!reduces()) return;
  ctx_.comm->all_reduce_sum(y);
  if (bias_) kernels::add_bias(y, bias_->data());
}

Tensor LinearBase::bias_in_product() const {
  return bias_ && !reduces() ? bias_->data() : Tensor();
}

void LinearBase::product(Tensor& y, const Tensor& x, const Tensor& bias) {
  if (fp8_) return kernels::linear_fp8(y, x, fp8_weight(), bias);
  kernels::linear(y, x, weight_->data(), bias, hints_);
}

bool LinearBase::forward_silu_mul(Tensor& out, const Tensor& x) {
  if (fp8_) return false;
  return kernels::linear_silu_mul(out, x, weight_->data(), bias_ ? bias_->data() : Tensor());
}

bool LinearBase::forward_rope_kv(Tensor& out, const Tensor& x, const kernels::QkvRope& r) {
  if (fp8_) return false;
  return kernels::linear_rope_kv(out, x, weight_->data(), bias_ ? bias_->data() : Tensor(), r);
}

Tensor LinearBase::forward(Step& step, const Tensor& x, const Tensor& out) {
  Tensor y = output(step, x.size(0), out);
  product(y, x, bias_in_product());
  finish(y);
  return y;
}

std::optional<kernels::Fp8Quant> LinearBase::input_quant() const {
  if (!fp8_ || quant_.inputs == Fp8Inputs::kNone || in_ % 16 != 0) return std::nullopt;
  return kernels::Fp8Quant::of(fp8_weight());
}

kernels::Fp8Input LinearBase::fp8_input(Step& step, int64_t rows) const {
  const std::optional<kernels::Fp8Quant> q = input_quant();
  ATOM_CHECK(q, "linear '{}': its input is not quantised before the product", weight_->name());
  kernels::Fp8Input in;
  in.quant = *q;
  in.codes = step.empty({rows, in_}, DType::kF8E4M3);
  in.scales = step.empty({kernels::fp8_input_scale_count(rows, in_, *q)}, DType::kF32);
  return in;
}

Tensor LinearBase::forward(Step& step, const LinearInput& x, const Tensor& out) {
  if (!x.quantised()) return forward(step, x.x, out);
  ATOM_CHECK(input_quant(), "linear '{}': given quantised activations, but its product takes {}",
             weight_->name(), fp8_ ? "16-bit activations (W8A16)" : "no FP8");
  Tensor y = output(step, x.q.rows(), out);
  kernels::linear_fp8(y, x.q, fp8_weight(), bias_in_product());
  finish(y);
  return y;
}

ReplicatedLinear::ReplicatedLinear(LayerContext& ctx, const std::string& prefix, int64_t in,
                                   int64_t out, bool bias, LinearStorage storage)
    : LinearBase(ctx, in, out) {
  LinearLayout l;
  l.parts = {{"", "", 0, 0, out, out}};
  l.cols = l.ckpt_cols = in;
  init_params(prefix, std::move(l), bias, storage);
}

ColumnParallelLinear::ColumnParallelLinear(LayerContext& ctx, int64_t in, int64_t out_per_rank)
    : LinearBase(ctx, in, out_per_rank) {}

ColumnParallelLinear::ColumnParallelLinear(LayerContext& ctx, const std::string& prefix, int64_t in,
                                           int64_t out, bool bias, LinearStorage storage)
    : LinearBase(ctx, in, out / ctx.tp_size) {
  check_divisible(prefix, "output size", out, ctx.tp_size);
  LinearLayout l;
  l.parts = {{"", "", ctx.tp_rank * out_, 0, out_, out}};
  l.cols = l.ckpt_cols = in;
  init_params(prefix, std::move(l), bias, storage);
}

RowParallelLinear::RowParallelLinear(LayerContext& ctx, const std::string& prefix, int64_t in,
                                     int64_t out, bool bias, bool reduce_results,
                                     LinearStorage storage)
    : LinearBase(ctx, in / ctx.tp_size, out), reduce_(reduce_results) {
  check_divisible(prefix, "input size", in, ctx.tp_size);
  LinearLayout l;
  l.parts = {{"", "", 0, 0, out, out}};
  l.col_start = ctx.tp_rank * in_;
  l.cols = in_;
  l.ckpt_cols = in;
  init_params(prefix, std::move(l), bias, storage);
}

namespace {
// This rank's kv heads: total / tp of them, or one head replicated over tp / total ranks.
struct KvShare {
  int64_t heads, replicas;
};
KvShare kv_share(const std::string& prefix, int64_t total_kv_heads, int tp) {
  if (total_kv_heads >= tp) {
    check_divisible(prefix, "number of key/value heads", total_kv_heads, tp);
    return {total_kv_heads / tp, 1};
  }
  if (tp % total_kv_heads != 0)
    fail("{}: tensor-parallel size {} is not a multiple of the {} key/value heads", prefix, tp,
         total_kv_heads);
  return {1, tp / total_kv_heads};
}
}  // namespace

QKVParallelLinear::QKVParallelLinear(LayerContext& ctx, const std::string& prefix, int64_t hidden,
                                     int64_t head_dim, int64_t total_heads, int64_t total_kv_heads,
                                     bool bias)
    : ColumnParallelLinear(ctx, hidden, 0), head_dim_(head_dim) {
  const int tp = ctx.tp_size;
  check_divisible(prefix, "number of attention heads", total_heads, tp);
  heads_ = total_heads / tp;
  const KvShare kv = kv_share(prefix, total_kv_heads, tp);
  kv_heads_ = kv.heads;
  kv_replicas_ = kv.replicas;
  out_ = (heads_ + 2 * kv_heads_) * head_dim;
  const int64_t q_rows = heads_ * head_dim, kv_rows = kv_heads_ * head_dim;
  const int64_t q_total = total_heads * head_dim, kv_total = total_kv_heads * head_dim;
  const int64_t q_start = ctx.tp_rank * q_rows;
  const int64_t kv_start = (ctx.tp_rank / kv_replicas_) * kv_rows;
  LinearLayout l;
  l.parts = {{"q", "", q_start, 0, q_rows, q_total},
             {"k", "", kv_start, q_rows, kv_rows, kv_total},
             {"v", "", kv_start, q_rows + kv_rows, kv_rows, kv_total}};
  l.cols = l.ckpt_cols = hidden;
  init_params(prefix, std::move(l), bias);
}

KVHeadParallelLinear::KVHeadParallelLinear(LayerContext& ctx, const std::string& prefix,
                                           int64_t hidden, int64_t head_dim, int64_t total_kv_heads,
                                           bool bias)
    : ColumnParallelLinear(ctx, hidden, 0) {
  const KvShare kv = kv_share(prefix, total_kv_heads, ctx.tp_size);
  out_ = kv.heads * head_dim;
  LinearLayout l;
  l.parts = {{"", "", (ctx.tp_rank / kv.replicas) * out_, 0, out_, total_kv_heads * head_dim}};
  l.cols = l.ckpt_cols = hidden;
  init_params(prefix, std::move(l), bias);
}

namespace {
std::vector<std::vector<int64_t>> one_block_each(const std::vector<int64_t>& sizes) {
  std::vector<std::vector<int64_t>> b;
  for (const int64_t s : sizes) b.push_back({s});
  return b;
}
}  // namespace

MergedColumnParallelLinear::MergedColumnParallelLinear(LayerContext& ctx, const std::string& prefix,
                                                       int64_t in,
                                                       std::vector<int64_t> output_sizes, bool bias)
    : MergedColumnParallelLinear(ctx, prefix, in, one_block_each(output_sizes), bias) {}

MergedColumnParallelLinear::MergedColumnParallelLinear(LayerContext& ctx, const std::string& prefix,
                                                       int64_t in,
                                                       std::vector<std::vector<int64_t>> blocks,
                                                       bool bias)
    : ColumnParallelLinear(ctx, in, 0) {
  LinearLayout l;
  out_ = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    int64_t rows = 0;
    for (const int64_t b : blocks[i]) rows += b;
    for (int64_t start = 0; const int64_t b : blocks[i]) {
      check_divisible(prefix, "output size", b, ctx.tp_size);
      const int64_t per = b / ctx.tp_size;
      l.parts.push_back({std::to_string(i), "", start + ctx.tp_rank * per, out_, per, rows});
      out_ += per;
      start += b;
    }
  }
  l.cols = l.ckpt_cols = in;
  init_params(prefix, std::move(l), bias);
}

WeightLoader rank_slice_loader(int rank, int tp, std::vector<int64_t> run_values) {
  return [rank, tp, runs = std::move(run_values)](Parameter& p, const Tensor& ckpt,
                                                  const std::string&, int) {
    const int64_t n = p.data().numel();
    bool even = true;
    int64_t total = 0;
    for (const int64_t r : runs) {
      total += r;
      even = even && r % tp == 0;
    }
    if (runs.empty()) total = n * tp;
    if (ckpt.numel() != n * tp || total != n * tp || !even || !ckpt.is_contiguous())
      fail("{}: checkpoint tensor {} does not hold {} values ({} on each of {} ranks)", p.name(),
           ckpt.str(), n * tp, n, tp);
    const Tensor src = ckpt.view({n * tp});
    Tensor dst = p.data().view({n});
    int64_t from = 0, to = 0;
    for (const int64_t r : runs.empty() ? std::vector<int64_t>{n * tp} : runs) {
      const int64_t per = r / tp;
      Tensor piece = dst.narrow(0, to, per);
      tensor_assign(piece, src.narrow(0, from + rank * per, per));
      from += r;
      to += per;
    }
  };
}

}  // namespace atom
