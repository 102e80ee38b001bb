#include "layers/gated_delta_net.h"

#include "core/error.h"

namespace atom {

std::vector<PackedModule> gated_delta_net_packed_modules() {
  return {{"in_proj_qkv", "in_proj_qkvz", "0"},
          {"in_proj_z", "in_proj_qkvz", "1"},
          {"in_proj_b", "in_proj_ba", "0"},
          {"in_proj_a", "in_proj_ba", "1"}};
}

namespace {
const GatedDeltaNetOptions& checked(const LayerContext& ctx, const std::string& prefix,
                                    const GatedDeltaNetOptions& o) {
  if (o.num_k_heads <= 0 || o.num_v_heads <= 0 || o.num_v_heads % o.num_k_heads != 0)
    fail("{}: linear_num_value_heads ({}) must be a positive multiple of linear_num_key_heads ({})",
         prefix, o.num_v_heads, o.num_k_heads);
  if (o.k_head_dim <= 0 || o.v_head_dim <= 0 || o.conv_kernel < 1)
    fail("{}: linear_key_head_dim {}, linear_value_head_dim {} and linear_conv_kernel_dim {} must "
         "be positive",
         prefix, o.k_head_dim, o.v_head_dim, o.conv_kernel);
  if (o.num_k_heads % ctx.tp_size != 0)
    fail("{}: linear_num_key_heads {} must be a multiple of the tensor-parallel size {}", prefix,
         o.num_k_heads, ctx.tp_size);
  return o;
}
}  // namespace

GatedDeltaNet::GatedDeltaNet(LayerContext& ctx, const std::string& prefix,
                             const GatedDeltaNetOptions& opts)
    : ctx_(ctx),
      o_(checked(ctx, prefix, opts)),
      k_heads_(opts.num_k_heads / ctx.tp_size),
      v_heads_(opts.num_v_heads / ctx.tp_size),
      key_dim_(static_cast<int64_t>(k_heads_) * opts.k_head_dim),
      value_dim_(static_cast<int64_t>(v_heads_) * opts.v_head_dim),
      conv_dim_(2 * key_dim_ + value_dim_),
      out_proj_(ctx, prefix + ".out_proj", static_cast<int64_t>(opts.num_v_heads) * opts.v_head_dim,
                opts.hidden, false) {
  // Tensor parallelism splits the key heads and their value heads (value head h follows key head
  // h / r): this rank's q, k, v, z channels and b, a heads (both projection layouts store them
  // part-major per rank), conv weights, A_log and dt_bias, and its states; out_proj reduces.
  const GatedDeltaNetOptions& o = o_;
  const int64_t r = o.num_v_heads / o.num_k_heads;
  const int64_t all_key = static_cast<int64_t>(o.num_k_heads) * o.k_head_dim,
                all_value = static_cast<int64_t>(o.num_v_heads) * o.v_head_dim;
  if (o.grouped_projections) {
    // Per key head: [q dk | k dk | v r·dv | z r·dv] and [b r | a r].
    grouped_qkvz_.emplace(
        ctx, prefix + ".in_proj_qkvz", o.hidden, o.num_k_heads,
        std::vector<int64_t>{o.k_head_dim, o.k_head_dim, r * o.v_head_dim, r * o.v_head_dim},
        false);
    grouped_ba_.emplace(ctx, prefix + ".in_proj_ba", o.hidden, o.num_k_heads,
                        std::vector<int64_t>{r, r}, false);
    in_proj_qkvz_ = &*grouped_qkvz_;
    in_proj_ba_ = &*grouped_ba_;
  } else {
    merged_qkvz_.emplace(
        ctx, prefix + ".in_proj_qkvz", o.hidden,
        std::vector<std::vector<int64_t>>{{all_key, all_key, all_value}, {all_value}}, false);
    merged_ba_.emplace(ctx, prefix + ".in_proj_ba", o.hidden,
                       std::vector<int64_t>{o.num_v_heads, o.num_v_heads}, false);
    in_proj_qkvz_ = &*merged_qkvz_;
    in_proj_ba_ = &*merged_ba_;
  }
  const int64_t K = o.conv_kernel;
  conv_weight_ = &ctx.params.add(
      prefix + ".conv1d.weight", ctx.param_tensor({conv_dim_, 1, K}, DType::kF32),
      rank_slice_loader(ctx.tp_rank, ctx.tp_size, {all_key * K, all_key * K, all_value * K}));
  const WeightLoader heads = rank_slice_loader(ctx.tp_rank, ctx.tp_size);
  A_log_ = &ctx.params.add(prefix + ".A_log", ctx.param_tensor({v_heads_}, DType::kF32), heads);
  dt_bias_ = &ctx.params.add(prefix + ".dt_bias", ctx.param_tensor({v_heads_}, DType::kF32), heads);
  norm_weight_ =
      &ctx.params.add(prefix + ".norm.weight", ctx.param_tensor({o.v_head_dim}, DType::kF32));
  ATOM_CHECK(ctx.state_specs, "{}: layer context collects no state specs", prefix);
  conv_state_ = static_cast<int>(ctx.state_specs->size());
  ctx.state_specs->push_back({{conv_dim_, o.conv_kernel - 1}, DType::kF32, /*rollback_rows=*/true});
  recurrent_state_ = static_cast<int>(ctx.state_specs->size());
  ctx.state_specs->push_back(
      {{v_heads_, o.k_head_dim, o.v_head_dim}, DType::kF32, /*rollback_rows=*/true});
}

Tensor GatedDeltaNet::forward(Step& step, const Tensor& x) {
  ATOM_CHECK(step.kv && step.kv->state.size() > static_cast<size_t>(recurrent_state_),
             "gated delta net: the step has no state pool for it");
  const int64_t T = x.size(0);
  const int Hv = v_heads_;
  Tensor qkvz = in_proj_qkvz_->forward(step, x);  // [T, conv_dim + Hv dv]
  Tensor ba = in_proj_ba_->forward(step, x);      // [T, 2 Hv]
  const Batch::Views& b = step.batch.dev;
  const kernels::StateRows rows{b.query_start, b.context_lens, b.state_slots,
                                step.batch.max_query_len, &b.state_rollback_slots};

  Tensor mixed = step.empty({T, conv_dim_}, ctx_.act_dtype);  // [q | k | v] after the conv
  Tensor conv_w = conv_weight_->data().view({conv_dim_, o_.conv_kernel});
  kernels::short_conv(mixed, qkvz.narrow(1, 0, conv_dim_), conv_w,
                      step.kv->state[static_cast<size_t>(conv_state_)], rows);

  Tensor core = step.empty({T, value_dim_}, ctx_.act_dtype);  // [T, Hv * dv]
  kernels::GatedDeltaArgs args;
  args.num_k_heads = k_heads_;
  args.num_v_heads = Hv;
  args.k_dim = o_.k_head_dim;
  args.v_dim = o_.v_head_dim;
  args.chunk_size = o_.chunk_size;
  kernels::gated_delta_rule(core, mixed.narrow(1, 0, key_dim_), mixed.narrow(1, key_dim_, key_dim_),
                            mixed.narrow(1, 2 * key_dim_, value_dim_), ba.narrow(1, 0, Hv),
                            ba.narrow(1, Hv, Hv), A_log_->data(), dt_bias_->data(),
                            step.kv->state[static_cast<size_t>(recurrent_state_)], rows, args);

  kernels::gated_rms_norm(core, core, qkvz.narrow(1, conv_dim_, value_dim_), norm_weight_->data(),
                          static_cast<float>(o_.eps));
  return out_proj_.forward(step, core);
}

}  // namespace atom
