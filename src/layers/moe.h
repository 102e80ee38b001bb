// Mixture of experts: the router, the fused experts (FusedMoE) and the sparse block built from
// them, with shared experts beside the routed ones or fused into the same layer.
//
// Parameters follow vLLM's FusedMoE (and so the spec's expert mapping): "<prefix>.w13_weight"
// [slots, 2 I, H] holds each expert's gate rows then up rows, "<prefix>.w2_weight" [slots, H, I]
// its down projection; I is this rank's share of the intermediate size (tensor parallelism
// splits every expert), rounded up to FusedMoEOptions::pad_intermediate_to with zero padding.
// Slots [0, num_experts) are the routed experts, then num_shared_slots fused shared experts.
//
// Expert parallelism (LayerContext::expert_parallel) splits the experts instead: a rank holds
// whole experts, its ExpertShare of them, in slots [0, share.count), and never reads the others'
// checkpoint tensors. Every rank routes every token (the hidden states are replicated after the
// attention's all-reduce); the router writes the slot of an expert this rank holds and -1 for the
// others, which the fused experts skip; the block's one all-reduce then sums the ranks' partial
// outputs, as under tensor parallelism. Shared experts stay a tensor-parallel MLP.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/moe.h"
#include "layers/linear.h"
#include "layers/mlp.h"
#include "layers/norm.h"
#include "loader/weight_loading.h"

namespace atom {

class ForkedStream;

// The spec's make_expert_params_mapping: for experts 0..num_experts-1, checkpoint names
// "experts.E.<gate>." -> w13 part "w1", "experts.E.<up>." -> w13 part "w3", "experts.E.<down>." ->
// w2 part "w2" (transformers' per-expert layout: gate_proj/up_proj/down_proj; Mixtral's w1/w3/w2).
std::vector<ExpertParamMapping> fused_moe_expert_mapping(const std::string& gate,
                                                         const std::string& down,
                                                         const std::string& up,
                                                         int64_t num_experts);
// Stacked checkpoints (transformers v5's layout): "experts.gate_up_proj" [E, 2I, H] (gate first)
// and "experts.down_proj" [E, H, I] hold every routed expert of a layer.
std::vector<ExpertParamMapping> fused_moe_stacked_mapping();

// MXFP4 blocks [rows, K/32, 16] U8 (two e2m1 values a byte, the low nibble first) and scales
// [rows, K/32] (U8 or E8M0 exponents) -> [rows, K] F32, value * 2^(scale - 127): exactly
// transformers' convert_moe_packed_tensors. An Error naming `what` when the shapes disagree.
Tensor mxfp4_dequantize(const Tensor& blocks, const Tensor& scales, const std::string& what);

// Writes a whole layer's experts, given in the canonical stacked layout, into a FusedMoE's
// parameters (this rank's slice, padding left zero), recording each expert's parts. A model whose
// checkpoint stacks its experts another way (GPT-OSS: transposed, gate and up interleaved, MXFP4)
// converts them and calls these.
class FusedMoEWriter {
 public:
  virtual ~FusedMoEWriter() = default;
  virtual int64_t num_experts() const = 0;
  virtual void gate_up(const Tensor& t) = 0;       // [E, 2I, H], gate rows first
  virtual void down(const Tensor& t) = 0;          // [E, H, I]
  virtual void gate_up_bias(const Tensor& t) = 0;  // [E, 2I], gate first
  virtual void down_bias(const Tensor& t) = 0;     // [E, H]
  // One routed expert at a time (formats converted expert by expert).
  virtual void gate_up_expert(int64_t e, const Tensor& t) = 0;  // [2I, H]
  virtual void down_expert(int64_t e, const Tensor& t) = 0;     // [H, I]
  // One routed expert in MXFP4 (FusedMoEOptions::quant kMxfp4): blocks [2I, H/32, 16] and
  // scales [2I, H/32] (gate rows first), blocks [H, I/32, 16] and scales [H, I/32]. Kept packed
  // where the layer stores MXFP4, else dequantised (mxfp4_dequantize).
  virtual void gate_up_mxfp4_expert(int64_t e, const Tensor& blocks, const Tensor& scales) = 0;
  virtual void down_mxfp4_expert(int64_t e, const Tensor& blocks, const Tensor& scales) = 0;
};

// A checkpoint format of the model's own: called with the tensor routed to part `shard` of one of
// the layer's parameters, and the expert its mapping entry names (-1: a stacked tensor).
using FusedMoEStackedFormat =
    std::function<void(FusedMoEWriter& w, const Tensor& ckpt, int expert)>;

// compressed-tensors' MXFP4 experts (format mxfp4-pack-quantized: Kimi-K3's): per expert J and
// projection, "experts.J.<proj>.weight_packed" [rows, K/2] U8 (two e2m1 values a byte, the low
// nibble first: MXFP4 blocks [rows, K/32, 16] laid flat) and "experts.J.<proj>.weight_scale"
// [rows, K/32] U8 (e8m0). The mapping routes them to this layer's w13 / w2; the formats pair each
// expert's tensors (in any order, on any loader thread) and hand them to the writer's MXFP4 calls.
// DeepSeek-V4's FP4 experts are the same bytes under other names: `values` "weight" [rows, K/2]
// I8 (float4_e2m1fn_x2, the low nibble first) and `scales` "scale" [rows, K/32] F8_E8M0, one
// scale per 32 values along K (the input axis).
std::vector<ExpertParamMapping> fused_moe_mxfp4_pack_mapping(
    const std::string& gate, const std::string& down, const std::string& up, int64_t num_experts,
    const std::string& values = "weight_packed", const std::string& scales = "weight_scale");
std::map<std::string, FusedMoEStackedFormat> fused_moe_mxfp4_pack_formats();

// The routed experts one rank holds. Without expert parallelism: all of them. With it, vLLM's
// linear placement over `ranks`: num_experts / ranks each, the first num_experts % ranks ranks
// one more, in order (rank 0 holds experts [0, count), rank 1 the next ones, ...).
struct ExpertShare {
  int64_t first = 0;
  int64_t count = 0;
  static ExpertShare of(int64_t num_experts, int rank, int ranks);
  bool holds(int64_t expert) const { return expert >= first && expert < first + count; }
};

// EPLB's re-placement over `ranks` ranks of (E + num_redundant) / ranks slots: each of the E
// experts one copy, each redundant copy to the expert with the most load per copy (ties: the
// lower index); the copies, heaviest share first, each to the least loaded rank with a free slot
// (one without that expert if any); on each rank an expert keeps a slot it had in `current`.
// Returns the logical expert of every physical one, rank-major.
std::vector<int64_t> eplb_placement(const std::vector<int64_t>& load, int64_t num_redundant,
                                    int ranks, const std::vector<int64_t>& current);
// Mean over max of the ranks' load under `placement` (1 when even; 1 for no load).
double eplb_balancedness(const std::vector<int64_t>& load, int ranks,
                         const std::vector<int64_t>& placement);

// How a checkpoint stores a layer's experts.
enum class ExpertQuant {
  kNone,  // dense weights, stored in LayerContext::weight_dtype
  // MXFP4 blocks and scales (quant_method mxfp4): on CUDA they stay packed (W4A16: the fused
  // kernels expand them to BF16 as they load them; kernels::MoeExperts' layout, parameters
  // "w13_weight"/"w2_weight" U8 and "w13_weight_scale"/"w2_weight_scale") when every rank holds
  // whole 32-value groups; on the CPU, the reference, and otherwise they are dequantised at load.
  kMxfp4,
};

struct FusedMoEOptions {
  int64_t num_experts = 0;  // routed
  int64_t hidden = 0;
  int64_t intermediate = 0;  // of one expert, unsharded
  // Shared experts loaded as slots of this layer (the checkpoint's shared MLP of width
  // num_shared_slots * intermediate is cut into that many slots); their tensors arrive as expert
  // num_experts (the spec's "mlp.shared_experts" -> "mlp.experts.<n_routed_experts>").
  int64_t num_shared_slots = 0;
  int64_t pad_intermediate_to = 1;  // this rank's I rounded up to a multiple of this
  bool bias = false;                // w13_bias [slots, 2I] and w2_bias [slots, H]
  kernels::Glu activation;          // of the routed experts (and of unfused shared experts)
  ExpertQuant quant = ExpertQuant::kNone;
  // Parts (shards of the expert mapping) in the model's own stacked formats.
  std::map<std::string, FusedMoEStackedFormat> stacked_formats;
};

class FusedMoE {
 public:
  FusedMoE(LayerContext& ctx, const std::string& prefix, const FusedMoEOptions& o);

  // out [T, H] = Σ_j topk_weights[t, j] · expert_{topk_ids[t, j]}(x[t]): this rank's partial sum
  // (the caller reduces across ranks once, after adding anything else).
  void forward(Step& step, const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
               Tensor& out);
  int64_t num_slots() const { return slots_; }
  // Points a router at this layer's slots: under expert parallelism this rank's range of
  // (physical) experts, with EPLB the replica tables and the load count.
  void bind_router(kernels::RouterArgs& a);
  // The checkpoint (logical) expert in each of this rank's routed slots [0, num_local_experts()).
  const std::vector<int64_t>& local_experts() const { return local_; }
  // The ranks split the experts (LayerContext::expert_parallel over more than one rank).
  bool expert_parallel() const { return ctx_.experts_split(); }
  int64_t num_local_experts() const { return static_cast<int64_t>(local_.size()); }
  // The physical expert of local slot 0 (expert parallelism; with EPLB physical experts are the
  // E + R copies, rank r holding [r L, (r + 1) L)).
  int64_t physical_first() const { return phys_first_; }
  std::vector<int64_t> slots_of(int64_t expert) const;  // this rank's slots holding `expert`
  bool holds(int64_t expert) const;
  // EPLB (LayerContext::num_redundant_experts > 0): which physical experts copy each logical one
  // ([E, R + 1] I32 and [E] I32, RouterArgs::replicas / replica_count) and the routed choices
  // counted per logical expert ([E] I64). Undefined without redundant experts.
  const Tensor& replicas() const { return replicas_; }
  // EPLB: the logical expert of every physical one (all ranks' slots, rank-major).
  const std::vector<int64_t>& placement() const { return placement_; }
  // EPLB: a new placement from expert_load() (eplb_placement), the moved slots' weights fetched
  // from the ranks that hold them, the router's tables updated in place (decode graphs stay
  // valid) and the load cleared. Every rank calls it at once, between steps. Returns whether the
  // placement changed.
  // balance (optional): the mean over the max of the ranks' load under the old and the new
  // placement (vLLM's balancedness; 1 is perfectly even), a copy carrying its expert's load over
  // its copies.
  bool rebalance(Communicator& comm, std::pair<double, double>* balance = nullptr);
  const Tensor& replica_count() const { return replica_count_; }
  Tensor& expert_load() { return expert_load_; }
  int64_t intermediate_per_rank() const { return inter_rank_; }  // of the checkpoint
  int64_t intermediate_padded() const { return inter_padded_; }  // as stored
  Parameter& w13() { return *w13_; }
  Parameter& w2() { return *w2_; }
  // The experts are stored MXFP4 (w13/w2 blocks plus scales), not dense.
  bool packed() const { return packed_; }
  // The experts are stored FP8 with their block scales (w13/w2 F8E4M3 plus F32 scales).
  bool fp8() const { return fp8_bn_ > 0; }

 private:
  class Writer;
  // The first intermediate channel of this rank's slice (0 when it holds whole experts).
  int64_t inter_start() const { return expert_parallel() ? 0 : ctx_.tp_rank * inter_rank_; }
  LayerContext& ctx_;
  FusedMoEOptions o_;
  std::vector<int64_t> local_;  // logical expert of each routed slot
  int64_t phys_first_ = 0;
  std::vector<int64_t> placement_;  // EPLB: logical expert of each physical one
  // local_ and the router's tables from placement_.
  void apply_placement();
  Tensor replicas_, replica_count_, expert_load_;
  int64_t slots_, inter_rank_, inter_padded_;
  bool packed_ = false;
  // FP8 experts kept FP8: the rows and columns (0: the whole row) of a scale block; 0 otherwise.
  int fp8_bn_ = 0, fp8_bk_ = 0;
  Parameter* w13_ = nullptr;  // [slots, 2 Ip, H] (packed: U8 [slots, 2 Ip, H/2]; FP8: F8E4M3)
  Parameter* w2_ = nullptr;   // [slots, H, Ip] (packed: U8 [slots, H, Ip/2]; FP8: F8E4M3)
  // packed: U8 [slots, H/32, 2 Ip]; FP8: F32 [slots, 2 Ip / bn, ceil(H / bk)]
  Parameter* w13_scale_ = nullptr;
  // packed: U8 [slots, Ip/32, H]; FP8: F32 [slots, ceil(H / bn), ceil(Ip / bk)]
  Parameter* w2_scale_ = nullptr;
  Parameter* w13_bias_ = nullptr;  // [slots, 2 Ip]
  Parameter* w2_bias_ = nullptr;   // [slots, H]: on rank 0 only (others zero), added once
};

struct SparseMoeOptions {
  int64_t hidden = 0;
  int64_t num_experts = 0;
  int64_t moe_intermediate = 0;
  kernels::RouterArgs router;       // top_k, scoring, groups, scale (shared slots set here)
  bool router_bias = false;         // "<gate>.bias" [E]
  bool correction_bias = false;     // "<gate>.e_score_correction_bias" [E], F32
  int64_t shared_intermediate = 0;  // 0: no shared experts
  bool fuse_shared = false;         // shared experts as slots of the fused layer
  // Qwen3-Next: the shared experts' output is scaled per token by sigmoid(shared_expert_gate(x)),
  // a [1, hidden] projection (not fusable: its weight is not 1).
  bool shared_gate = false;
  // Kimi-K3's latent MoE (routed_expert_hidden_size > 0): the routed experts run in a narrower
  // space, z = experts(routed_expert_down_proj(x)) [T, latent_hidden]; their sum (all-reduced
  // across ranks) goes through routed_expert_norm (an RMSNorm, when latent_norm) and
  // routed_expert_up_proj back to hidden. The router and the shared experts see x itself.
  int64_t latent_hidden = 0;
  bool latent_norm = false;
  double latent_norm_eps = 1e-6;
  // On CUDA, the unfused shared experts run on a second stream while the router and the routed
  // experts run on the step's (Kimi-K3's ATOM_K3_SHARED_EXPERT_OVERLAP); the same values.
  bool shared_overlap = false;
  std::string gate_name = "gate";
  std::string shared_name = "shared_experts";
  std::string shared_gate_name = "shared_expert_gate";
  FusedMoEOptions experts;  // activation, biases, formats (sizes set from the above)
};

// gate (router) -> routed experts (+ shared experts) -> one all-reduce across ranks. Under expert
// parallelism the shared experts are never fused (Model turns LayerContext's switch off). A latent
// MoE reduces its routed and shared parts apart (the norm needs the whole routed sum).
class SparseMoeBlock : public FeedForward {
 public:
  // prefix: the block's module, e.g. "model.layers.3.mlp".
  SparseMoeBlock(LayerContext& ctx, const std::string& prefix, const SparseMoeOptions& o);
  Tensor forward(Step& step, const Tensor& x, const Tensor& out = Tensor()) override;

  // Router logits [T, E] F32 and the routing of x: topk_ids, topk_weights [T, K].
  void route(Step& step, const Tensor& x, Tensor& topk_ids, Tensor& topk_weights);

 private:
  LayerContext& ctx_;
  SparseMoeOptions o_;
  kernels::RouterArgs args_;
  ReplicatedLinear gate_;            // hidden -> E, the same on every rank
  Parameter* correction_ = nullptr;  // [E] F32
  FusedMoE experts_;
  std::unique_ptr<GatedMlp> shared_;               // unfused shared experts, left unreduced
  std::unique_ptr<ReplicatedLinear> shared_gate_;  // hidden -> 1
  // Latent MoE: hidden -> latent_hidden, latent_hidden -> hidden (replicated), the latent norm.
  std::unique_ptr<ReplicatedLinear> latent_down_, latent_up_;
  std::unique_ptr<RMSNorm> latent_norm_;
  std::shared_ptr<ForkedStream> side_;  // shared_overlap on CUDA, made on the first forward
};

// Whether shared experts load as slots of the fused layer (ATOM_MOE_FUSE_SHARED_EXPERTS, default
// off); the two ways compute the same values.
bool moe_fuse_shared_experts_from_env();

}  // namespace atom
