#include "layers/mla.h"

#include <cmath>

#include "core/convert.h"
#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/gated_delta.h"
#include "kernels/linear.h"

namespace atom {

namespace {

int64_t heads_per_rank(const std::string& prefix, const MlaOptions& o, int tp) {
  if (o.num_heads < 1 || o.num_heads % tp != 0)
    fail("{}: num_attention_heads ({}) must be a positive multiple of the tensor-parallel size {}",
         prefix, o.num_heads, tp);
  return o.num_heads / tp;
}

const MlaOptions& checked(const std::string& prefix, const MlaOptions& o) {
  auto need = [&](int64_t v, const char* field) {
    if (v < 1) fail("{}: {} must be positive, got {}", prefix, field, v);
  };
  need(o.hidden, "hidden_size");
  need(o.kv_lora_rank, "kv_lora_rank");
  if (o.qk_rope_head_dim < 0)
    fail("{}: qk_rope_head_dim must be 0 or positive, got {}", prefix, o.qk_rope_head_dim);
  if (o.qk_rope_head_dim == 0 && o.apply_rope)
    fail("{}: qk_rope_head_dim 0 leaves no channels for RoPE (apply_rope must be off)", prefix);
  need(o.v_head_dim, "v_head_dim");
  need(o.qk_nope_head_dim, "qk_nope_head_dim");
  if (o.q_lora_rank < 0) fail("{}: q_lora_rank must be positive or null", prefix);
  if (o.qk_rope_head_dim % 2 != 0)
    fail("{}: qk_rope_head_dim ({}) must be even", prefix, o.qk_rope_head_dim);
  return o;
}

}  // namespace

const RotaryEmbedding& MultiHeadLatentAttention::rotary() const {
  ATOM_CHECK(rotary_, "multi-head latent attention without rope channels has no RoPE");
  return *rotary_;
}

double mla_softmax_scale(int64_t qk_head_dim, const RopeConfig& rope) {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim));
  if (rope.type != "default" && rope.mscale_all_dim && *rope.mscale_all_dim != 0) {
    const double m =
        rope.factor <= 1 ? 1.0 : 0.1 * *rope.mscale_all_dim * std::log(rope.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

MultiHeadLatentAttention::MultiHeadLatentAttention(LayerContext& ctx, const std::string& prefix,
                                                   const MlaOptions& o)
    : ctx_(ctx),
      heads_(heads_per_rank(prefix, checked(prefix, o), ctx.tp_size)),
      nope_(o.qk_nope_head_dim),
      rope_(o.qk_rope_head_dim),
      latent_(o.kv_lora_rank),
      v_(o.v_head_dim),
      kv_a_proj_with_mqa_(ctx, prefix + ".kv_a_proj_with_mqa", o.hidden,
                          o.kv_lora_rank + o.qk_rope_head_dim, o.bias),
      kv_a_layernorm_(ctx, prefix + ".kv_a_layernorm", o.kv_lora_rank, o.norm_eps),
      // Split and absorbed after loading: an FP8 checkpoint's kv_b_proj is dequantised at load.
      kv_b_proj_(ctx, prefix + ".kv_b_proj", o.kv_lora_rank,
                 o.num_heads * (o.qk_nope_head_dim + o.v_head_dim), false,
                 LinearStorage::kDequantize),
      o_proj_(ctx, prefix + ".o_proj", o.num_heads * o.v_head_dim, o.hidden, o.bias) {
  if (o.output_gate)
    g_proj_ = std::make_unique<ColumnParallelLinear>(ctx, prefix + ".g_proj", o.hidden,
                                                     o.num_heads * o.v_head_dim, false);
  if (rope_ > 0)
    rotary_ = std::make_unique<RotaryEmbedding>(ctx, static_cast<int>(rope_), o.rope,
                                                o.max_position_embeddings, o.interleaved_rope);
  const int64_t qk = nope_ + rope_;
  if (o.q_lora_rank > 0) {
    q_a_proj_ = std::make_unique<ReplicatedLinear>(ctx, prefix + ".q_a_proj", o.hidden,
                                                   o.q_lora_rank, o.bias);
    q_a_layernorm_ =
        std::make_unique<RMSNorm>(ctx, prefix + ".q_a_layernorm", o.q_lora_rank, o.norm_eps);
    q_b_proj_ = std::make_unique<ColumnParallelLinear>(ctx, prefix + ".q_b_proj", o.q_lora_rank,
                                                       o.num_heads * qk, false);
  } else {
    q_proj_ = std::make_unique<ColumnParallelLinear>(ctx, prefix + ".q_proj", o.hidden,
                                                     o.num_heads * qk, false);
  }
  ATOM_CHECK(!rotary_ || rotary_->rot_dim() == rope_,
             "{}: RoPE over {} of qk_rope_head_dim {} channels "
             "(partial_rotary_factor is not used by MLA)",
             prefix, rotary_ ? rotary_->rot_dim() : 0, rope_);
  if (!o.apply_rope) {
    no_rope_freq_ = ctx.param_tensor({rope_ / 2}, DType::kF32);
    tensor_assign(no_rope_freq_, Tensor::zeros({rope_ / 2}, DType::kF32));
  }
  scale_ = static_cast<float>(o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(qk)));
  ATOM_CHECK(ctx.cache_specs, "{}: layer context collects no cache specs", prefix);
  cache_index_ = static_cast<int>(ctx.cache_specs->size());
  ctx.cache_specs->push_back(CacheSpec::latent(static_cast<int>(latent_ + rope_), ctx.act_dtype));
  o_proj_.set_hints({.after_latency_bound = true});  // it follows decode attention
  ctx.params.add_post_load([this] { absorb_weights(); });
}

void MultiHeadLatentAttention::absorb_weights() {
  // kv_b_proj's rows on this rank: per head, nope rows of W_UK_h then v rows of W_UV_h, each
  // [., L]. The query absorbs W_UK_h as x · (W_UK_hᵀ)ᵀ, so its transpose is kept.
  const Tensor w = tensor_cast_cpu(kv_b_proj_.weight().data(), DType::kF32);
  Tensor t = Tensor::empty({heads_, latent_, nope_}, DType::kF32);
  const float* src = w.ptr<float>();
  float* dst = t.ptr<float>();
  for (int64_t h = 0; h < heads_; ++h)
    for (int64_t n = 0; n < nope_; ++n)
      for (int64_t l = 0; l < latent_; ++l)
        dst[(h * latent_ + l) * nope_ + n] = src[(h * (nope_ + v_) + n) * latent_ + l];
  // In kv_b_proj's dtype (F32 for a dequantised FP8 checkpoint on the CPU).
  w_uk_t_ = ctx_.param_tensor({heads_, latent_, nope_}, kv_b_proj_.weight().data().dtype());
  tensor_assign(w_uk_t_, t);
}

const LinearBase* MultiHeadLatentAttention::input_linear() const {
  const LinearBase* first =
      q_proj_ ? static_cast<const LinearBase*>(q_proj_.get()) : q_a_proj_.get();
  const auto q = first->input_quant();
  if (!q || q->activation == kernels::Fp8Activation::kTensorStatic) return nullptr;
  auto same = [&](const LinearBase& l) {
    const auto o = l.input_quant();
    return o && o->activation == q->activation && o->block_k == q->block_k;
  };
  if (!same(kv_a_proj_with_mqa_) || (g_proj_ && !same(*g_proj_))) return nullptr;
  return first;
}

MultiHeadLatentAttention::Projected MultiHeadLatentAttention::project(Step& step,
                                                                      const LinearInput& x) {
  ATOM_CHECK(step.kv, "multi-head latent attention needs a KV cache");
  Projected p;
  if (q_proj_) {
    p.q = q_proj_->forward(step, x);
  } else if (fuse_q_norm_quant_ && q_b_proj_->input_quant()) {
    const Tensor q_a = q_a_proj_->forward(step, x);
    p.q = q_b_proj_->forward(
        step, LinearInput(q_a_layernorm_->forward_fp8(step, q_a, nullptr, *q_b_proj_)));
  } else {
    p.q_resid = q_a_layernorm_->forward(step, q_a_proj_->forward(step, x));
    p.q = q_b_proj_->forward(step, p.q_resid);
  }
  if (g_proj_) p.gate = g_proj_->forward(step, x);
  Tensor kv = kv_a_proj_with_mqa_.forward(step, x);  // [T, L + R] = (c_kv | k_pe)
  Tensor c_kv = kv.narrow(1, 0, latent_);
  kv_a_layernorm_.forward_heads_inplace(step, c_kv);  // one "head" of L channels
  kernels::MlaRopeArgs r;
  r.num_heads = static_cast<int>(heads_);
  r.nope_dim = static_cast<int>(nope_);
  r.rope_dim = static_cast<int>(rope_);
  r.latent_dim = static_cast<int>(latent_);
  const bool nope = no_rope_freq_.defined();
  r.scale = nope ? 1.0f : rotary_->scale();  // cos 0 = 1, sin 0 = 0: q_pe and k_pe as projected
  r.interleaved = rotary_ && rotary_->interleaved();
  Tensor& cache = step.kv->plane(static_cast<size_t>(cache_index_), CacheKind::kLatent);
  kernels::mla_rope_cache_write(p.q, kv, step.batch.dev.positions,
                                nope ? no_rope_freq_ : rotary_->inv_freq(), r, cache,
                                step.batch.dev.slot_mapping);
  return p;
}

Tensor MultiHeadLatentAttention::attend(Step& step, const Projected& p, const Tensor& topk) {
  const Batch& b = step.batch;
  const int64_t T = p.q.size(0), W = latent_ + rope_, qk = nope_ + rope_;
  // q'_h = (W_UK_hᵀ q_nope_h | q_pe_h)
  Tensor q_lat = step.empty({T, heads_ * W}, ctx_.act_dtype);
  Tensor absorbed0 = q_lat.narrow(1, 0, latent_);
  if (!kernels::linear_heads(absorbed0, p.q.narrow(1, 0, nope_), w_uk_t_.select(0, 0),
                             static_cast<int>(heads_), W, qk, latent_ * nope_)) {
    for (int64_t h = 0; h < heads_; ++h) {
      Tensor absorbed = q_lat.narrow(1, h * W, latent_);
      kernels::linear(absorbed, p.q.narrow(1, h * qk, nope_), w_uk_t_.select(0, h));
    }
  }
  if (rope_ == 0) {
    // No rope channels (GLM-5.3): the absorbed query is the whole row.
  } else if (p.q.is_contiguous() && T > 0) {  // every head's q_pe in one copy: [T H, R] rows
    Tensor pe = q_lat.view({T * heads_, W}).narrow(1, latent_, rope_);
    kernels::cast(pe, p.q.view({T * heads_, qk}).narrow(1, nope_, rope_));
  } else {
    for (int64_t h = 0; h < heads_; ++h) {
      Tensor pe = q_lat.narrow(1, h * W + latent_, rope_);
      kernels::cast(pe, p.q.narrow(1, h * qk + nope_, rope_));
    }
  }
  kernels::MlaArgs a;
  a.num_heads = static_cast<int>(heads_);
  a.latent_dim = static_cast<int>(latent_);
  a.rope_dim = static_cast<int>(rope_);
  a.scale = scale_;
  a.max_query_len = b.max_query_len;
  a.max_context_len = b.max_context_len;
  kernels::AttentionBatch ab{&b.dev.query_start, &b.dev.context_lens, &b.dev.page_indptr,
                             &b.dev.page_indices};
  Tensor workspace;
  const int64_t ws = kernels::mla_paged_attention_workspace_size(ctx_.device, T, a, ctx_.act_dtype,
                                                                 topk.defined() ? topk.size(1) : 0);
  if (ws > 0) {
    workspace = step.empty({ws}, DType::kF32);
    ab.workspace = &workspace;
  }
  Tensor o_lat = step.empty({T, heads_ * latent_}, ctx_.act_dtype);
  const Tensor& cache = step.kv->plane(static_cast<size_t>(cache_index_), CacheKind::kLatent);
  kernels::mla_paged_attention(o_lat, q_lat, cache, ab, topk, a);
  // o_h = W_UV_h o_lat_h: W_UV_h is rows [h (nope + v) + nope, + v) of kv_b_proj, [v, L].
  Tensor o = step.empty({T, heads_ * v_}, ctx_.act_dtype);
  const Tensor& w_kv_b = kv_b_proj_.weight().data();
  Tensor o0 = o.narrow(1, 0, v_);
  if (!kernels::linear_heads(o0, o_lat.narrow(1, 0, latent_), w_kv_b.narrow(0, nope_, v_),
                             static_cast<int>(heads_), v_, latent_, (nope_ + v_) * latent_)) {
    for (int64_t h = 0; h < heads_; ++h) {
      Tensor oh = o.narrow(1, h * v_, v_);
      kernels::linear(oh, o_lat.narrow(1, h * latent_, latent_),
                      w_kv_b.narrow(0, h * (nope_ + v_) + nope_, v_));
    }
  }
  if (g_proj_) {
    ATOM_CHECK(p.gate.defined(), "MLA with an output gate: attend() without project()'s gate");
    kernels::mul_sigmoid(o, o, p.gate);
  }
  return o_proj_.forward(step, o);
}

}  // namespace atom
