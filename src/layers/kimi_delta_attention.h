// Kimi delta attention (KDA), the linear-attention mixer of Kimi-Linear (transformers'
// KimiLinearDeltaAttention, with its KimiLinearForgetGate):
//
//   q, k, v = silu(causal_conv1d(q_proj(x))), ... (k_proj, v_proj; one conv and conv state each)
//   f = f_b_proj(f_a_proj(x));  g = -exp(A_log) · softplus(f + dt_bias)   per channel
//     (GLM-5.3's safe gate instead: g = lower_bound · sigmoid(exp(A_log) · (f + dt_bias)))
//   o = kda_rule(q, k, v, g, β = sigmoid(b_proj(x)))          (kernels/gated_delta.h)
//   o = (o_norm.weight ⊙ rmsnorm(o)) · sigmoid(g_b_proj(g_a_proj(x)))   per head;   o_proj(o)
//     (Kimi-K3's full-rank output gate instead: sigmoid(g_proj(x)))
//
// Parameters keep the checkpoint's names (Moonshot's layout, which transformers also saves):
// the forget gate's f_a_proj, f_b_proj, dt_bias and A_log directly under the module, and
// q_conv1d / k_conv1d / v_conv1d apart; A_log as [1, 1, H, 1] (Kimi) or [H] (GLM-5.3). Tensor
// parallelism splits the heads: a rank holds H / tp of them (projections column-parallel, the
// conv weights, A_log and dt_bias cut by head, its own states), and o_proj reduces. Each
// sequence keeps three conv states and a recurrent state [H, d, d] (fp32) in the state slot pool.
#pragma once

#include <memory>
#include <string>

#include "kernels/gated_delta.h"
#include "layers/context.h"
#include "layers/linear.h"

namespace atom {

struct KimiDeltaAttentionOptions {
  int64_t hidden = 0;
  int num_heads = 0, head_dim = 0;  // linear_num_heads, linear_head_dim
  int conv_kernel = 4;              // linear_conv_kernel_dim
  double eps = 1e-6;                // of the gated output norm (rms_norm_eps)
  // Of the chunked rule for prefill (0: recurrent throughout). 16, as FLA's KDA sub-chunks: the
  // WY form's fp32 error grows with the chunk under strong decays (Kimi-K3's bounded gate, down
  // to -5 a token): on the kimi_k3 fixture 1.3e-5 relative at 64, 5.8e-6 at 16.
  int chunk_size = 16;
  // < 0: GLM-5.3's safe gate g = gate_lower_bound · sigmoid(exp(A_log) · (f + dt_bias))
  // (linear_lower_bound); 0: Kimi's -exp(A_log) · softplus(f + dt_bias).
  float gate_lower_bound = 0.0f;
  // Kimi-K3: the output gate is one full-rank g_proj (hidden -> H d) instead of the low-rank
  // g_a_proj, g_b_proj pair.
  bool full_rank_output_gate = false;
};

class KimiDeltaAttention {
 public:
  // prefix: the mixer's module, e.g. "model.layers.0.self_attn".
  KimiDeltaAttention(LayerContext& ctx, const std::string& prefix,
                     const KimiDeltaAttentionOptions& o);
  // x [T, hidden] -> [T, hidden]
  Tensor forward(Step& step, const Tensor& x);

 private:
  LayerContext& ctx_;
  KimiDeltaAttentionOptions o_;
  int64_t dim_;                                     // H * d (all ranks)
  int heads_;                                       // H / tp: this rank's heads
  int64_t dim_r_;                                   // heads_ * d
  ColumnParallelLinear q_proj_, k_proj_, v_proj_;   // hidden -> H d
  ReplicatedLinear f_a_proj_;                       // hidden -> d
  ColumnParallelLinear f_b_proj_;                   // d -> H d
  std::unique_ptr<ReplicatedLinear> g_a_proj_;      // hidden -> d (low-rank output gate)
  std::unique_ptr<ColumnParallelLinear> g_b_proj_;  // d -> H d
  std::unique_ptr<ColumnParallelLinear> g_proj_;    // hidden -> H d (full-rank output gate)
  ColumnParallelLinear b_proj_;                     // hidden -> H
  RowParallelLinear o_proj_;                        // H d -> hidden
  Parameter* conv_weight_[3];                       // q, k, v: [H d, 1, K] F32
  Parameter* A_log_;                                // [1, 1, H, 1] F32
  Parameter* dt_bias_;                              // [H d] F32
  Parameter* o_norm_weight_;                        // [d] F32
  int conv_state_[3], recurrent_state_;             // indices into the step's state pools
};

}  // namespace atom
