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
  // The product that reads x (for a norm that writes its quantised input).
  const LinearBase& input_linear() const { return qkv_proj_; }

 private:
  QKVParallelLinear qkv_proj_;
  RowParallelLinear o_proj_;
  RMSNorm q_norm_, k_norm_;  // [head_dim]
  RotaryEmbedding rotary_;
  Attention attn_;
  int64_t q_size_, kv_size_;
};

}  // namespace atom
