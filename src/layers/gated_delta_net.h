// Gated DeltaNet, the linear-attention mixer of Qwen3-Next and Qwen3.5 (transformers'
// Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet):
//
//   [q | k | v | z] = in_proj_qkvz(x),  [b | a] = in_proj_ba(x)
//   [q | k | v] = silu(causal_conv1d([q | k | v]))           (conv state: the last K-1 inputs)
//   o = gated_delta_rule(q, k, v, β = sigmoid(b), g = -exp(A_log)·softplus(a + dt_bias))
//   o = (norm.weight ⊙ rmsnorm(o)) · silu(z)   per value head;   out_proj(o)
//
// Projections are stored part-major ([q | k | v | z], [b | a]) whatever the checkpoint's layout:
// Qwen3-Next's fused in_proj_qkvz / in_proj_ba interleave the parts per key head and are
// regrouped at load; Qwen3.5's separate in_proj_qkv, in_proj_z, in_proj_b and in_proj_a load as
// parts of the same two parameters (gated_delta_net_packed_modules). Each sequence keeps a conv
// state and a recurrent state [Hv, dk, dv] (fp32) in the state slot pool. Tensor parallelism
// splits the key heads, each with its r = Hv / Hk value heads: a rank holds Hk / tp key heads
// (its share of q, k, v, z, b, a, conv weights, A_log, dt_bias and states), and out_proj reduces.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kernels/gated_delta.h"
#include "layers/context.h"
#include "layers/grouped_linear.h"
#include "layers/linear.h"
#include "loader/weight_names.h"

namespace atom {

struct GatedDeltaNetOptions {
  int64_t hidden = 0;
  int num_k_heads = 0, num_v_heads = 0;  // linear_num_key_heads, linear_num_value_heads
  int k_head_dim = 0, v_head_dim = 0;    // linear_key_head_dim, linear_value_head_dim
  int conv_kernel = 4;                   // linear_conv_kernel_dim
  double eps = 1e-6;                     // of the gated RMSNorm (rms_norm_eps)
  // Qwen3-Next's checkpoint layout: in_proj_qkvz / in_proj_ba grouped per key head. Otherwise
  // Qwen3.5's separate projections.
  bool grouped_projections = true;
  int chunk_size = 64;  // of the chunked delta rule for prefill (0: recurrent throughout)
};

// Qwen3.5's separate projections as parts of the stored ones (add to the model's packed modules).
std::vector<PackedModule> gated_delta_net_packed_modules();

class GatedDeltaNet {
 public:
  // prefix: the mixer's module, e.g. "model.layers.0.linear_attn".
  GatedDeltaNet(LayerContext& ctx, const std::string& prefix, const GatedDeltaNetOptions& o);
  // x [T, hidden] -> [T, hidden]
  Tensor forward(Step& step, const Tensor& x);

 private:
  LayerContext& ctx_;
  GatedDeltaNetOptions o_;
  int k_heads_, v_heads_;                   // this rank's key and value heads
  int64_t key_dim_, value_dim_, conv_dim_;  // this rank's: q or k, v and [q | k | v] channels
  std::optional<GroupedColumnParallelLinear> grouped_qkvz_, grouped_ba_;
  std::optional<MergedColumnParallelLinear> merged_qkvz_, merged_ba_;
  LinearBase* in_proj_qkvz_ = nullptr;  // hidden -> [q | k | v | z]
  LinearBase* in_proj_ba_ = nullptr;    // hidden -> [b | a]
  Parameter* conv_weight_;              // [conv_dim, 1, K] F32 (this rank's channels)
  Parameter* A_log_;                    // [Hv / tp] F32
  Parameter* dt_bias_;                  // [Hv / tp] F32
  Parameter* norm_weight_;              // [dv] F32
  RowParallelLinear out_proj_;          // Hv * dv -> hidden
  int conv_state_, recurrent_state_;    // indices into the step's state pools
};

}  // namespace atom
