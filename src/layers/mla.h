// Multi-head latent attention (transformers' DeepseekV2Attention / DeepseekV3Attention): the
// keys and values of all heads come from one compressed latent per token, which is all the cache
// keeps (CacheKind::kLatent: a row (c_kv | k_pe) of kv_lora_rank + qk_rope_head_dim).
//
//   q    = q_b_proj(q_a_layernorm(q_a_proj(x)))   (q_lora_rank set), or q_proj(x)   [T, H, nope +
//   R] c_kv, k_pe = split(kv_a_proj_with_mqa(x));  c_kv = kv_a_layernorm(c_kv) q_pe, k_pe rotated
//   (interleaved pairs or halves); (c_kv | k_pe) written to the cache per head h, with kv_b_proj =
//   [W_UK_h (nope rows); W_UV_h (v rows)] over the latent:
//     q'_h = (W_UK_hᵀ q_nope_h | q_pe_h)    scores = scale · q'_h · (c_kv | k_pe)_j
//     o_h  = W_UV_h Σ_j p_j c_kv_j
//   out  = o_proj(o)   (Kimi-K3's gated output: o_proj(o · sigmoid(g_proj(x))))
// This absorbed form equals transformers' expanded one (k_nope_h = W_UK_h c_kv,
// v_h = W_UV_h c_kv) and is one code path for prefill, chunked prefill, prefix-cached prefill and
// decode. Tensor parallelism splits the heads (q_proj / q_b_proj, kv_b_proj, o_proj); the latent
// projections, their norms and the cache are replicated.
#pragma once

#include <memory>
#include <string>

#include "kernels/mla.h"
#include "layers/context.h"
#include "layers/linear.h"
#include "layers/norm.h"
#include "layers/rotary.h"

namespace atom {

struct MlaOptions {
  int64_t hidden = 0;
  int64_t num_heads = 0;    // all ranks
  int64_t q_lora_rank = 0;  // 0: a plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool bias = false;              // attention_bias: q_a_proj, kv_a_proj_with_mqa and o_proj
  double norm_eps = 1e-6;         // q_a_layernorm, kv_a_layernorm (transformers: RMSNorm's default)
  double scale = 0;               // softmax scale; 0: (qk_nope_head_dim + qk_rope_head_dim)^-0.5
  bool interleaved_rope = false;  // rotate pairs (2i, 2i + 1) instead of halves
  // false: no rotation at all (Kimi-Linear's NoPE MLA: the qk_rope_head_dim channels are still
  // split off and shared by the heads, but never rotated). qk_rope_head_dim 0 (GLM-5.3): no such
  // channels at all.
  bool apply_rope = true;
  RopeConfig rope;  // frequencies over qk_rope_head_dim channels
  int64_t max_position_embeddings = 0;
  // Kimi-K3: the heads' output scaled by sigmoid(g_proj(x)) (g_proj: hidden -> H v, split by head)
  // before o_proj.
  bool output_gate = false;
};

// The softmax scale transformers' DeepSeek attention uses: qk_head_dim^-0.5, times mscale² with
// mscale = 0.1 · mscale_all_dim · ln(factor) + 1 when the rope type is not "default" and
// mscale_all_dim is set and non-zero (yarn_apply_mscale).
double mla_softmax_scale(int64_t qk_head_dim, const RopeConfig& rope);

class MultiHeadLatentAttention {
 public:
  MultiHeadLatentAttention(LayerContext& ctx, const std::string& prefix, const MlaOptions& o);

  // The projections of x [T, hidden], RoPE and the cache write.
  struct Projected {
    Tensor q;        // [T, H_rank * (nope + R)], q_pe rotated
    Tensor q_resid;  // q_a_layernorm(q_a_proj(x)) [T, q_lora_rank] (undefined without q LoRA)
    Tensor gate;     // g_proj(x) [T, H_rank * v] (MlaOptions::output_gate), else undefined
  };
  // x may come quantised for input_linear() (a norm fused with the quantisation).
  Projected project(Step& step, const LinearInput& x);
  // Attention of the projected queries over the cache, then o_proj: [T, hidden] (all-reduced).
  // topk [T, K] I32: context positions each token attends to (sparse attention), or undefined.
  Tensor attend(Step& step, const Projected& p, const Tensor& topk = Tensor());
  Tensor forward(Step& step, const LinearInput& x) { return attend(step, project(step, x)); }
  // The product that reads x first (q_proj, or q_a_proj), when every product reading x
  // (kv_a_proj_with_mqa, g_proj) quantises its input the same way, dynamically: then one quantised
  // x serves them all. nullptr otherwise (16-bit or W8A16 weights, static scales, mixed).
  const LinearBase* input_linear() const;
  // The spec's ATOM_ENABLE_DS_QKNORM_QUANT_FUSION: q_a_layernorm written as q_b_proj's quantised
  // input (Projected::q_resid then stays undefined: only for callers that do not read it).
  void set_fused_q_norm_quant(bool on) { fuse_q_norm_quant_ = on; }

  // The RoPE of the qk_rope_head_dim channels (an Error when there are none).
  const RotaryEmbedding& rotary() const;
  int cache_index() const { return cache_index_; }

 private:
  void absorb_weights();  // post-load: W_UKᵀ per head from kv_b_proj

  LayerContext& ctx_;
  int64_t heads_, nope_, rope_, latent_, v_;      // heads on this rank
  std::unique_ptr<ColumnParallelLinear> q_proj_;  // without q LoRA: hidden -> H (nope + R)
  std::unique_ptr<ReplicatedLinear> q_a_proj_;    // hidden -> q_lora_rank
  std::unique_ptr<RMSNorm> q_a_layernorm_;
  std::unique_ptr<ColumnParallelLinear> q_b_proj_;  // q_lora_rank -> H (nope + R)
  ReplicatedLinear kv_a_proj_with_mqa_;             // hidden -> L + R
  RMSNorm kv_a_layernorm_;                          // [L]
  ColumnParallelLinear kv_b_proj_;                  // L -> H (nope + v): [W_UK_h; W_UV_h] per head
  RowParallelLinear o_proj_;                        // H v -> hidden (all-reduce)
  std::unique_ptr<ColumnParallelLinear> g_proj_;    // output_gate: hidden -> H v
  std::unique_ptr<RotaryEmbedding> rotary_;         // null when qk_rope_head_dim is 0
  Tensor no_rope_freq_;  // without RoPE: zero frequencies (every rotation the identity)
  float scale_;
  int cache_index_;
  Tensor w_uk_t_;  // [H_rank, L, nope]: W_UK_hᵀ, in the weights' dtype
  bool fuse_q_norm_quant_ = false;
};

}  // namespace atom
