#include "layers/attention.h"

#include <cmath>

#include "core/convert.h"
#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/rope.h"

namespace atom {

Attention::Attention(LayerContext& ctx, const std::string& prefix, const AttentionOptions& o)
    : ctx_(ctx), head_dim_(static_cast<int>(o.head_dim)), sliding_window_(o.sliding_window) {
  heads_ = static_cast<int>(o.total_heads / ctx.tp_size);
  kv_heads_ = static_cast<int>(std::max<int64_t>(1, o.total_kv_heads / ctx.tp_size));
  scale_ =
      static_cast<float>(o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(o.head_dim)));
  ATOM_CHECK(ctx.cache_specs, "{}: layer context collects no cache specs", prefix);
  cache_index_ = static_cast<int>(ctx.cache_specs->size());
  ctx.cache_specs->push_back(
      CacheSpec::key_value(kv_heads_, head_dim_, ctx.act_dtype, sliding_window_));
  if (o.sinks) {
    const int64_t per = heads_, start = ctx.tp_rank * per, total = o.total_heads;
    sinks_ = &ctx.params.add(
        prefix_join(prefix, "sinks"), ctx.param_tensor({per}, DType::kF32),
        [per, start, total](Parameter& p, const Tensor& ckpt, const std::string&, int) {
          param_check_shape(p, ckpt, {total}, "");
          tensor_assign(p.data(), ckpt.narrow(0, start, per));
        });
  }
}

Tensor Attention::forward(Step& step, const Tensor& q, const Tensor& k, const Tensor& v) {
  ATOM_CHECK(step.kv, "attention needs a KV cache");
  Tensor& kc = step.kv->key(cache_index_);
  Tensor& vc = step.kv->value(cache_index_);
  kernels::kv_cache_write(kc, vc, k, v, step.batch.dev.slot_mapping, kv_scales_);
  return attend(step, q, kc, vc);
}

Tensor Attention::forward(Step& step, Tensor& q, Tensor& k, const Tensor& v,
                          const RotaryEmbedding& rotary, const kernels::QkNorm* norm) {
  ATOM_CHECK(step.kv, "attention needs a KV cache");
  Tensor& kc = step.kv->key(cache_index_);
  Tensor& vc = step.kv->value(cache_index_);
  rotary.forward_and_cache(step, q, k, v, kc, vc, kv_scales_, norm);
  return attend(step, q, kc, vc);
}

Tensor Attention::forward_projected(Step& step, const Tensor& x, LinearBase& qkv_proj,
                                    const RotaryEmbedding& rotary) {
  ATOM_CHECK(step.kv, "attention needs a KV cache");
  if (x.device().is_cpu() || rotary.head_dim() != head_dim_) return Tensor();
  Tensor& kc = step.kv->key(cache_index_);
  Tensor& vc = step.kv->value(cache_index_);
  kernels::QkvRope r;
  r.q_heads = heads_;
  r.kv_heads = kv_heads_;
  r.head_dim = head_dim_;
  r.positions = &step.batch.dev.positions;
  r.inv_freq = &rotary.inv_freq();
  r.scale = rotary.scale();
  r.rot_dim = rotary.rot_dim();
  r.interleaved = rotary.interleaved();
  r.k_cache = &kc;
  r.v_cache = &vc;
  r.slot_mapping = &step.batch.dev.slot_mapping;
  // Where no fused kernel applies (prefill-sized steps), the buffer goes straight back: the
  // caller's projection allocates its own, and the layer's peak stays one qkv buffer.
  const Arena::Mark before = step.arena.mark();
  Tensor qkv = step.empty({x.size(0), qkv_proj.out_per_rank()}, ctx_.act_dtype);
  if (!qkv_proj.forward_rope_kv(qkv, x, r)) {
    step.arena.release(before);
    return Tensor();
  }
  return attend(step, qkv.narrow(1, 0, static_cast<int64_t>(heads_) * head_dim_), kc, vc);
}

Tensor Attention::attend(Step& step, const Tensor& q, Tensor& kc, Tensor& vc) {
  const Batch& b = step.batch;
  Tensor out = step.empty({q.size(0), static_cast<int64_t>(heads_) * head_dim_}, ctx_.act_dtype);
  kernels::AttentionArgs a;
  a.num_heads = heads_;
  a.num_kv_heads = kv_heads_;
  a.head_dim = head_dim_;
  a.scale = scale_;
  a.sliding_window = sliding_window_;
  a.max_query_len = b.max_query_len;
  a.max_context_len = b.max_context_len;
  a.kv_scales = kv_scales_;
  kernels::AttentionBatch ab{&b.dev.query_start, &b.dev.context_lens, &b.dev.page_indptr,
                             &b.dev.page_indices};
  Tensor workspace;
  const int64_t ws = kernels::paged_attention_workspace_size(ctx_.device, q.size(0), a, q.dtype());
  if (ws > 0) {
    workspace = step.empty({ws}, DType::kF32);
    ab.workspace = &workspace;
  }
  kernels::paged_attention(out, q, kc, vc, ab, sinks_ ? sinks_->data() : Tensor(), a);
  return out;
}

}  // namespace atom
