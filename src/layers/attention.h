// Paged attention: writes this step's keys and values into the layer's cache pages, then attends
// each new token over its sequence's whole cached context.
#pragma once

#include <string>

#include "kernels/attention.h"
#include "layers/context.h"
#include "layers/linear.h"
#include "layers/rotary.h"

namespace atom {

struct AttentionOptions {
  int64_t total_heads = 0;
  int64_t total_kv_heads = 0;
  int64_t head_dim = 0;
  double scale = 0;        // 0: head_dim^-0.5
  int sliding_window = 0;  // 0: full attention
  bool sinks = false;      // learned per-head sink logits at "<prefix>.sinks" [total_heads]
};

class Attention {
 public:
  Attention(LayerContext& ctx, const std::string& prefix, const AttentionOptions& o);

  // q [T, Hq * D], k and v [T, Hk * D] (rows may be strided views of a fused qkv) -> [T, Hq * D]
  Tensor forward(Step& step, const Tensor& q, const Tensor& k, const Tensor& v);
  // The same with RoPE applied to q and k first, fused with the cache write.
  Tensor forward(Step& step, Tensor& q, Tensor& k, const Tensor& v, const RotaryEmbedding& rotary,
                 const kernels::QkNorm* norm = nullptr);
  // x [T, hidden] through the fused [q; k; v] projection, RoPE and the cache write in one kernel
  // where the backend has one for this step (decode-sized steps on CUDA with a cache of the
  // activations' dtype, kernels::linear_rope_kv), then attention: [T, Hq * D]. Undefined, having
  // computed nothing, where it has none; the caller then projects and calls forward().
  Tensor forward_projected(Step& step, const Tensor& x, LinearBase& qkv_proj,
                           const RotaryEmbedding& rotary);
  int cache_index() const { return cache_index_; }

 private:
  Tensor attend(Step& step, const Tensor& q, Tensor& k_cache, Tensor& v_cache);
  LayerContext& ctx_;
  int heads_, kv_heads_, head_dim_, sliding_window_;
  float scale_;
  // FP8 caches: vLLM's default per-tensor scales of 1. Checkpoint scales (`*.k_scale`,
  // `*.v_scale`) are not read: a checkpoint holding them fails to load, its tensors unclaimed.
  kernels::KvScales kv_scales_;
  int cache_index_;
  Parameter* sinks_ = nullptr;
};

}  // namespace atom
