#include "layers/kimi_delta_attention.h"

#include "core/convert.h"
#include "core/error.h"

namespace atom {

namespace {
const KimiDeltaAttentionOptions& checked(const LayerContext& ctx, const std::string& prefix,
                                         const KimiDeltaAttentionOptions& o) {
  if (o.num_heads <= 0 || o.head_dim <= 0 || o.conv_kernel < 1)
    fail("{}: linear_num_heads {}, linear_head_dim {} and linear_conv_kernel_dim {} must be "
         "positive",
         prefix, o.num_heads, o.head_dim, o.conv_kernel);
  if (o.num_heads % ctx.tp_size != 0)
    fail("{}: linear_num_heads {} must be a multiple of the tensor-parallel size {}", prefix,
         o.num_heads, ctx.tp_size);
  return o;
}

}  // namespace

KimiDeltaAttention::KimiDeltaAttention(LayerContext& ctx, const std::string& prefix,
                                       const KimiDeltaAttentionOptions& opts)
    : ctx_(ctx),
      o_(checked(ctx, prefix, opts)),
      dim_(static_cast<int64_t>(opts.num_heads) * opts.head_dim),
      heads_(opts.num_heads / ctx.tp_size),
      dim_r_(static_cast<int64_t>(heads_) * opts.head_dim),
      q_proj_(ctx, prefix + ".q_proj", opts.hidden, dim_, false),
      k_proj_(ctx, prefix + ".k_proj", opts.hidden, dim_, false),
      v_proj_(ctx, prefix + ".v_proj", opts.hidden, dim_, false),
      f_a_proj_(ctx, prefix + ".f_a_proj", opts.hidden, opts.head_dim, false),
      f_b_proj_(ctx, prefix + ".f_b_proj", opts.head_dim, dim_, false),
      b_proj_(ctx, prefix + ".b_proj", opts.hidden, opts.num_heads, false),
      o_proj_(ctx, prefix + ".o_proj", dim_, opts.hidden, false) {
  if (o_.full_rank_output_gate) {
    g_proj_ =
        std::make_unique<ColumnParallelLinear>(ctx, prefix + ".g_proj", o_.hidden, dim_, false);
  } else {
    g_a_proj_ = std::make_unique<ReplicatedLinear>(ctx, prefix + ".g_a_proj", o_.hidden,
                                                   o_.head_dim, false);
    g_b_proj_ =
        std::make_unique<ColumnParallelLinear>(ctx, prefix + ".g_b_proj", o_.head_dim, dim_, false);
  }
  // Tensor parallelism splits the heads: this rank's q/k/v channels, conv weights and states,
  // forget-gate and beta heads; o_proj sums the ranks' parts.
  const WeightLoader heads = rank_slice_loader(ctx.tp_rank, ctx.tp_size);
  const char* conv_names[3] = {".q_conv1d.weight", ".k_conv1d.weight", ".v_conv1d.weight"};
  for (int i = 0; i < 3; ++i)
    conv_weight_[i] = &ctx.params.add(
        prefix + conv_names[i], ctx.param_tensor({dim_r_, 1, o_.conv_kernel}, DType::kF32), heads);
  // Kimi's checkpoints hold A_log as [1, 1, H, 1], GLM-5.3's as [H]: either, as the H values.
  // Kimi-K3's is [128] for 96 heads, the rest zero: the first H values, when the rest are 0.
  const int H = o_.num_heads;
  A_log_ = &ctx.params.add(
      prefix + ".A_log", ctx.param_tensor({1, 1, heads_, 1}, DType::kF32),
      [heads, H](Parameter& p, const Tensor& ckpt, const std::string& shard, int expert) {
        if (ckpt.numel() <= H || !ckpt.is_contiguous()) return heads(p, ckpt, shard, expert);
        const Tensor f = tensor_cast_cpu(ckpt.view({ckpt.numel()}), DType::kF32);
        for (int64_t i = H; i < f.numel(); ++i)
          if (f.ptr<float>()[i] != 0.0f)
            fail("{}: checkpoint tensor {} has {} values for {} heads, and value {} past the "
                 "heads is {}, not 0 (padding)",
                 p.name(), ckpt.str(), f.numel(), H, i, f.ptr<float>()[i]);
        heads(p, f.narrow(0, 0, H), shard, expert);
      });
  dt_bias_ = &ctx.params.add(prefix + ".dt_bias", ctx.param_tensor({dim_r_}, DType::kF32), heads);
  o_norm_weight_ =
      &ctx.params.add(prefix + ".o_norm.weight", ctx.param_tensor({o_.head_dim}, DType::kF32));
  ATOM_CHECK(ctx.state_specs, "{}: layer context collects no state specs", prefix);
  for (int i = 0; i < 3; ++i) {
    conv_state_[i] = static_cast<int>(ctx.state_specs->size());
    ctx.state_specs->push_back({{dim_r_, o_.conv_kernel - 1}, DType::kF32, /*rollback_rows=*/true});
  }
  recurrent_state_ = static_cast<int>(ctx.state_specs->size());
  ctx.state_specs->push_back(
      {{heads_, o_.head_dim, o_.head_dim}, DType::kF32, /*rollback_rows=*/true});
}

Tensor KimiDeltaAttention::forward(Step& step, const Tensor& x) {
  ATOM_CHECK(step.kv && step.kv->state.size() > static_cast<size_t>(recurrent_state_),
             "kimi delta attention: the step has no state pool for it");
  const int64_t T = x.size(0);
  const Batch::Views& b = step.batch.dev;
  const kernels::StateRows rows{b.query_start, b.context_lens, b.state_slots,
                                step.batch.max_query_len, &b.state_rollback_slots};

  // Short convs on q, k and v, each with its conv state.
  Tensor qkv[3];
  LinearBase* proj[3] = {&q_proj_, &k_proj_, &v_proj_};
  for (int i = 0; i < 3; ++i) {
    Tensor raw = proj[i]->forward(step, x);
    qkv[i] = step.empty({T, dim_r_}, ctx_.act_dtype);
    Tensor w = conv_weight_[i]->data().view({dim_r_, o_.conv_kernel});
    kernels::short_conv(qkv[i], raw, w, step.kv->state[static_cast<size_t>(conv_state_[i])], rows);
  }
  // The forget gate's low-rank pre-activation (dt_bias, softplus and A_log in the rule) and the
  // input gate's logits.
  Tensor f = f_b_proj_.forward(step, f_a_proj_.forward(step, x));  // [T, H d]
  Tensor beta = b_proj_.forward(step, x);                          // [T, H]

  Tensor core = step.empty({T, dim_r_}, ctx_.act_dtype);
  kernels::KdaArgs args;
  args.num_heads = heads_;
  args.head_dim = o_.head_dim;
  args.chunk_size = o_.chunk_size;
  args.gate_lower_bound = o_.gate_lower_bound;
  kernels::kda_rule(core, qkv[0], qkv[1], qkv[2], f, beta, A_log_->data().view({heads_}),
                    dt_bias_->data(), step.kv->state[static_cast<size_t>(recurrent_state_)], rows,
                    args);

  Tensor gate = g_proj_ ? g_proj_->forward(step, x)
                        : g_b_proj_->forward(step, g_a_proj_->forward(step, x));  // [T, H d]
  kernels::gated_rms_norm(core, core, gate, o_norm_weight_->data(), static_cast<float>(o_.eps),
                          kernels::NormGate::kSigmoid);
  return o_proj_.forward(step, core);
}

}  // namespace atom
