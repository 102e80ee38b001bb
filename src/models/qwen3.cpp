// Qwen3 (transformers' modular_qwen3.py): Llama with per-head RMSNorm on q and k before RoPE.
#include "models/qwen3.h"

#include "core/env.h"

namespace atom {

int qwen3_layer_window(const ModelConfig& c, int64_t layer) {
  if (!c.layer_types.empty()) return llama_layer_window(c, layer);
  if (!c.text.get_bool("use_sliding_window", false) || !c.sliding_window) return 0;
  const int64_t max_window_layers = c.text.get_int("max_window_layers", c.num_hidden_layers);
  return layer >= max_window_layers ? static_cast<int>(*c.sliding_window) : 0;
}

Qwen3Attention::Qwen3Attention(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                               const std::string& prefix)
    : fuse_input_quant_(llama_fused_rmsnorm_quant()),
      fuse_qk_norm_rope_(env_bool("ATOM_ENABLE_QK_NORM_ROPE_CACHE_QUANT_FUSION", true)),
      qkv_proj_(ctx, prefix + ".qkv_proj", c.hidden_size, c.head_dim, c.num_attention_heads,
                c.num_key_value_heads, c.attention_bias),
      o_proj_(ctx, prefix + ".o_proj", c.num_attention_heads * c.head_dim, c.hidden_size,
              c.attention_bias),
      q_norm_(ctx, prefix + ".q_norm", c.head_dim, c.rms_norm_eps),
      k_norm_(ctx, prefix + ".k_norm", c.head_dim, c.rms_norm_eps),
      rotary_(ctx, static_cast<int>(c.head_dim), c.rope, c.max_position_embeddings),
      attn_(ctx, prefix + ".attn",
            {c.num_attention_heads, c.num_key_value_heads, c.head_dim, 0,
             qwen3_layer_window(c, layer), false}) {
  q_size_ = qkv_proj_.heads_per_rank() * c.head_dim;
  kv_size_ = qkv_proj_.kv_heads_per_rank() * c.head_dim;
  o_proj_.set_hints({.after_latency_bound = true});  // it follows decode attention
}

Tensor Qwen3Attention::forward(Step& step, const LinearInput& x) {
  Tensor qkv = qkv_proj_.forward(step, x);
  Tensor q = qkv.narrow(1, 0, q_size_);
  Tensor k = qkv.narrow(1, q_size_, kv_size_);
  Tensor v = qkv.narrow(1, q_size_ + kv_size_, kv_size_);
  // q_norm and k_norm (over head_dim, each head on its own), RoPE and the cache write: one
  // kernel on CUDA.
  if (fuse_qk_norm_rope_) {
    const kernels::QkNorm norms = RMSNorm::heads(q_norm_, k_norm_);
    return o_proj_.forward(step, attn_.forward(step, q, k, v, rotary_, &norms));
  }
  q_norm_.forward_heads_inplace(step, q);
  k_norm_.forward_heads_inplace(step, k);
  return o_proj_.forward(step, attn_.forward(step, q, k, v, rotary_));
}

class Qwen3ForCausalLM : public DecoderOnlyLM<LlamaDecoderLayer<Qwen3Attention>> {
 public:
  using DecoderOnlyLM::DecoderOnlyLM;
  std::vector<std::string> quantization_methods() const override {
    return fp8_quantization_methods();
  }
};
ATOM_REGISTER_MODEL_SUPPORTING("Qwen3ForCausalLM", Qwen3ForCausalLM, llama_support());

}  // namespace atom
