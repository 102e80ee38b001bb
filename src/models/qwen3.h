// Qwen3's attention (transformers' modular_qwen3.py), shared by Qwen3 and Qwen3-MoE: Llama's with
// per-head RMSNorm on q and k before RoPE.
#pragma once

#include "models/llama.h"

namespace atom {

// Qwen3 configs written before layer_types existed give use_sliding_window + max_window_layers.
int qwen3_layer_window(const ModelConfig& c, int64_t layer);

class Qwen3Attention {
 public:
  Qwen3Attention(LayerContext& ctx, const ModelConfig& c, int64_t layer, const std::string& prefix);
  Tensor forward(Step& step, const LinearInput& x);
  // The product that reads x, for the norm before it to write its quantised input
  // (ATOM_LLAMA_ENABLE_AITER_TRITON_FUSED_RMSNORM_QUANT: Qwen3 is built on Llama's decoder layer);
  // nullptr when the switch is off.
  const LinearBase* input_linear() const { return fuse_input_quant_ ? &qkv_proj_ : nullptr; }

 private:
  bool fuse_input_quant_;
  // The spec's ATOM_ENABLE_QK_NORM_ROPE_CACHE_QUANT_FUSION (default on here: the fused kernel is
  // atom's measured default): q_norm and k_norm inside the RoPE + cache write (+ FP8 cache
  // quantisation) kernel; 0: the per-head norms as their own kernel first.
  bool fuse_qk_norm_rope_;
  QKVParallelLinear qkv_proj_;
  RowParallelLinear o_proj_;
  RMSNorm q_norm_, k_norm_;  // [head_dim]
  RotaryEmbedding rotary_;
  Attention attn_;
  int64_t q_size_, kv_size_;
};

}  // namespace atom
