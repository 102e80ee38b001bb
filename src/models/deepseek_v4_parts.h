// The pieces DeepSeek-V4 (models/deepseek_v4.cpp) and DeepSeek-V4.1 (models/deepseek_v41.cpp)
// share: the mixture of experts of every layer, the attention's per-query core (sliding-window
// and compressed keys with a sink logit per head), the grouped output projection, and the
// checkpoint's release names. The MoE runs on the CPU and CUDA; the attention helpers are the
// CPU's (F32).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/compressed_kv.h"
#include "kernels/moe.h"
#include "layers/linear.h"
#include "layers/mlp.h"
#include "layers/moe.h"
#include "loader/weight_loading.h"

namespace atom {

// "DeepSeek-V4: <what> <t> must be contiguous F32 on the CPU" unless it is.
void deepseek_v4_check_cpu_f32(const Tensor& t, const char* what);

float deepseek_v4_dot(const float* a, const float* b, int64_t n);

// One query head over `keys` (each D wide, read as key and value), with a sink logit: out[D] =
// Σ_k softmax([sink, q·k scale])_k key_k (the sink's share is dropped).
void deepseek_v4_sink_attention(const float* q, const std::vector<const float*>& keys, int64_t D,
                                float sink, float scale, float* out);

// The grouped output projection's first half: o [T, heads · head_dim] in o_groups groups of
// consecutive heads, group g through rows [g o_lora, (g + 1) o_lora) of wo_a [o_groups o_lora,
// heads head_dim / o_groups] -> [T, o_groups o_lora] (then wo_b). The CPU: F32 loops; CUDA: one
// per-head product over the groups (kernels::linear_heads) or a product per group.
Tensor deepseek_v4_grouped_wo_a(Step& step, const Tensor& o, const Tensor& wo_a, int64_t o_groups,
                                int64_t o_lora);

// The step's device views that kernels/compressed_kv.h's kernels read (CUDA).
kernels::CompressedBatch deepseek_v4_compressed_batch(const Batch& b);

struct DeepseekV4MoeOptions {
  int64_t hidden = 0, vocab = 0, experts = 0, top_k = 0, moe_inter = 0, shared = 0;
  double scaling = 1.0, limit = 10.0;
  std::string scoring = "sqrtsoftplus";  // sqrtsoftplus | sigmoid | softmax
  bool fp4_experts = false;              // E2M1 routed experts with E8M0 scales per 32 (MXFP4)
  bool hash = false;  // experts chosen by the frozen tid2eid table of the input token
};

// The mixture of experts of a DeepSeek-V4 / V4.1 layer: scores (sqrt(softplus) by default), a
// correction bias for the choice ("<prefix>.gate.bias"), no groups, renormalised and scaled
// weights; hash layers route by "<prefix>.gate.tid2eid". Routed and shared experts apply the
// clamped SwiGLU silu(min(g, limit)) · clamp(u, ±limit); one all-reduce of the sum under tensor
// parallelism.
class DeepseekV4Moe {
 public:
  DeepseekV4Moe(LayerContext& ctx, const DeepseekV4MoeOptions& o, const std::string& prefix);
  Tensor forward(Step& step, const Tensor& x);

 private:
  LayerContext& ctx_;
  DeepseekV4MoeOptions o_;
  kernels::RouterArgs args_;
  ReplicatedLinear gate_;
  FusedMoE experts_;
  Parameter* bias_ = nullptr;
  Parameter* tid2eid_ = nullptr;
  std::vector<int32_t> table_;  // tid2eid, checked
  Tensor table_dev_;            // CUDA: table_ [vocab, top_k] I32 on the device
  std::unique_ptr<GatedMlp> shared_;
};

struct DeepseekV41Config;
struct HyperConnectionOptions;
// The MoE and hyper-connection options of a DeepSeek-V4.1 layer, or of a DSpark stage (V4.1's
// decoder layers): sizes from the parsed config, routed_scaling_factor, swiglu_limit and
// scoring_func (sqrt-softplus only) from its text config.
DeepseekV4MoeOptions deepseek_v41_moe_options(const DeepseekV41Config& cfg);
HyperConnectionOptions deepseek_v41_hc_options(const DeepseekV41Config& cfg);

// DeepSeek's release names (no "model." prefix; embed, norm, head; layers.N; the experts'
// w1 / w3 / w2, FP4 or not; ".scale" beside each quantised weight when `quantized`) on top of
// `s`. The MTP stages (mtp.*) are never read. When `quantized`, every quantised weight of the
// backbone (draft_stages false) or of the DSpark stages mtp.* (draft_stages true: their
// drafter's, models/dspark.h, which reads them under their own names) must have its scale and
// every scale its weight, checked by name before any data is read.
void deepseek_v4_release_names(WeightLoadSpec& s, int64_t experts, bool fp4_experts, bool quantized,
                               bool draft_stages = false);

}  // namespace atom
