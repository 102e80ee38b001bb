#include "models/llama.h"

#include "core/env.h"
#include "kernels/elementwise.h"

namespace atom {

int llama_layer_window(const ModelConfig& c, int64_t layer) {
  if (c.layer_types.empty() || c.layer_types.at(layer) != "sliding_attention") return 0;
  if (!c.sliding_window)
    fail("{}: layer {} is a sliding_attention layer but 'sliding_window' is missing", c.path,
         layer);
  return static_cast<int>(*c.sliding_window);
}

LlamaAttention::LlamaAttention(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                               const std::string& prefix, int sliding_window, bool sinks)
    : fuse_input_quant_(llama_fused_rmsnorm_quant()),
      qkv_proj_(ctx, prefix + ".qkv_proj", c.hidden_size, c.head_dim, c.num_attention_heads,
                c.num_key_value_heads, c.attention_bias),
      o_proj_(ctx, prefix + ".o_proj", c.num_attention_heads * c.head_dim, c.hidden_size,
              c.attention_bias),
      rotary_(ctx, static_cast<int>(c.head_dim), c.rope, c.max_position_embeddings),
      attn_(ctx, prefix,
            {c.num_attention_heads, c.num_key_value_heads, c.head_dim, 0,
             sliding_window >= 0 ? sliding_window : llama_layer_window(c, layer), sinks}) {
  q_size_ = qkv_proj_.heads_per_rank() * c.head_dim;
  kv_size_ = qkv_proj_.kv_heads_per_rank() * c.head_dim;
  o_proj_.set_hints({.after_latency_bound = true});  // it follows decode attention
}

// On by default, as the spec's ATOM has them: measured faster at every size
// (docs/performance.md, "The spec's fusion switches").
bool llama_fused_rmsnorm_quant() {
  return env_bool("ATOM_LLAMA_ENABLE_AITER_TRITON_FUSED_RMSNORM_QUANT", true);
}
bool llama_fused_silu_mul_quant() {
  return env_bool("ATOM_LLAMA_ENABLE_AITER_TRITON_FUSED_SILU_MUL_QUANT", true);
}

Tensor LlamaAttention::forward(Step& step, const LinearInput& x) {
  // Decode-sized steps on CUDA: projection, RoPE and the cache write in one kernel.
  if (!x.quantised())
    if (Tensor o = attn_.forward_projected(step, x.x, qkv_proj_, rotary_); o.defined())
      return o_proj_.forward(step, o);
  Tensor qkv = qkv_proj_.forward(step, x);
  Tensor q = qkv.narrow(1, 0, q_size_);
  Tensor k = qkv.narrow(1, q_size_, kv_size_);
  Tensor v = qkv.narrow(1, q_size_ + kv_size_, kv_size_);
  Tensor o = attn_.forward(step, q, k, v, rotary_);  // RoPE fused with the cache write
  return o_proj_.forward(step, o);
}

Tensor logits_for_batch(Step& step, const Tensor& hidden, ParallelLMHead& lm_head) {
  // Decode steps ask for every row in order: no gather.
  const std::vector<int32_t>& want = step.batch.logits_indices;
  bool all_rows = static_cast<int64_t>(want.size()) == hidden.size(0);
  for (size_t i = 0; all_rows && i < want.size(); ++i) all_rows = want[i] == static_cast<int>(i);
  if (all_rows) return lm_head.forward(step, hidden);
  const Tensor& idx = step.batch.dev.logits_indices;
  Tensor rows = step.empty({idx.numel(), hidden.size(1)}, hidden.dtype());
  kernels::gather_rows(rows, hidden, idx);
  return lm_head.forward(step, rows);
}

class LlamaForCausalLM : public DecoderOnlyLM<LlamaDecoderLayer<LlamaAttention>> {
 public:
  using DecoderOnlyLM::DecoderOnlyLM;
  std::vector<std::string> quantization_methods() const override {
    return fp8_quantization_methods();
  }
};
ATOM_REGISTER_MODEL_SUPPORTING("LlamaForCausalLM", LlamaForCausalLM, llama_support());

}  // namespace atom
