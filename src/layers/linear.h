// Parallel linear layers. Each owns its weight loader: given a checkpoint tensor of the full
// (unsharded) layer, it writes this rank's slice. Weights are [out, in] as in transformers.
//
// A layer holds the parameters of its checkpoint's quantisation method (LinearQuant, from
// quantization_config by the layer's checkpoint name; a fused layer by its parts' names): a plain
// weight, or an FP8 weight with its scales. Every kind describes how this rank's weight is cut
// from the checkpoint's (LinearLayout), and one set of loaders slices the weight, the scale grid
// and input_scale by it. FP8 weights stay FP8 where the device computes FP8 products
// (LayerContext::fp8_resident: CUDA), through kernels::linear_fp8; elsewhere (the CPU reference)
// they are dequantised to the weight dtype at load and computed as any other weight.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kernels/linear.h"
#include "kernels/linear_fp8.h"
#include "layers/context.h"

namespace atom {

// How this rank's weight [out_per_rank, cols] is cut from the checkpoint: each part (the one
// tensor of an unfused layer, or q/k/v, gate/up of a fused one) gives rows
// [src_row, src_row + rows) of its checkpoint tensor [ckpt_rows, ckpt_cols] to rows
// [dst_row, dst_row + rows), columns [col_start, col_start + cols).
struct LinearLayout {
  struct Part {
    std::string shard;      // "" unfused; "q", "k", "v"; "0", "1", ...
    std::string ckpt_name;  // the part's checkpoint module, which its quantisation is looked up by
    int64_t src_row = 0, dst_row = 0, rows = 0, ckpt_rows = 0;
  };
  std::vector<Part> parts;
  int64_t col_start = 0, cols = 0, ckpt_cols = 0;
};

// How a layer stores a quantised checkpoint weight. kAuto: FP8 stays FP8 where the device
// computes FP8 products, else it is dequantised at load. kDequantize: dequantised at load on
// every device (a weight other code reads densely: MLA's absorbed kv_b_proj). kUnquantized: the
// layer is never quantised, whatever the config says (routers, as transformers and the
// checkpoints keep them).
enum class LinearStorage { kAuto, kDequantize, kUnquantized };

// W [N, K] F32 = float(w) * scale, for an FP8 weight `w` [N, K] (F8_E4M3) and its checkpoint
// scale (F32/BF16/F16, or F8_E8M0 exponents b meaning 2^(b - 127)): kBlock [ceil(N / bn), ceil(K /
// bk)], kChannel [N] or [N, 1], kTensor
// [] or [1]. A wrong dtype or shape is an error naming `what`.
Tensor fp8_dequantize(const Tensor& w, const Tensor& scale, const LinearQuant& q,
                      const std::string& what);
// The dtype an FP8 checkpoint weight is dequantised into: F32 on the CPU reference (its values
// are rarely BF16 values), the weight dtype elsewhere.
inline DType fp8_dequantized_dtype(const LayerContext& ctx) {
  return ctx.device.is_cpu() ? DType::kF32 : ctx.weight_dtype;
}
// A CPU F32 copy of an FP8 checkpoint weight's scale (F32, BF16, F16, or F8_E8M0 exponents b
// meaning 2^(b - 127)); an Error naming `what` for another dtype or a NaN exponent.
Tensor fp8_scale_to_f32(const Tensor& scale, const std::string& what);
// Checks an FP8 checkpoint weight and its scale fit `q` for a [N, K] weight (what names them).
void fp8_check_weight(const Tensor& w, int64_t N, int64_t K, const std::string& what);
void fp8_check_scale(const Tensor& scale, int64_t N, int64_t K, const LinearQuant& q,
                     const std::string& what);

// The quantisation of a layer at `prefix` (parameter-side) whose checkpoint tensors are `shards`
// of its parts ({""}: unfused), by the parts' checkpoint names (LayerContext::packed_modules);
// parts stored differently are an error naming them.
LinearQuant linear_quant_for(const LayerContext& ctx, const std::string& prefix,
                             const std::vector<std::string>& shards,
                             std::vector<std::string>* ckpt_names = nullptr);

// A linear layer's input as the op before it wrote it: activations, or (an op fused with the FP8
// activation quantisation: kernels::rms_norm_fp8, glu_fp8) codes and scales for the layer's FP8
// product (LinearBase::input_quant). Converts from either.
struct LinearInput {
  Tensor x;                               // undefined when quantised
  kernels::Fp8Input q;                    // codes undefined when not
  LinearInput(const Tensor& t) : x(t) {}  // NOLINT: implicit, as the layers' Tensor inputs
  LinearInput(kernels::Fp8Input in) : q(std::move(in)) {}  // NOLINT
  bool quantised() const { return q.codes.defined(); }
  int64_t rows() const { return quantised() ? q.rows() : x.size(0); }
};

class LinearBase {
 public:
  // y = x · Wᵀ (+ b)   x [T, in_per_rank] -> [T, out_per_rank], written into `out` when it is
  // given (a caller-owned buffer), else into a new tensor of the step.
  Tensor forward(Step& step, const Tensor& x, const Tensor& out = Tensor());
  // The same on activations quantised before the call (x.quant must be input_quant()'s); a
  // plain input goes to the overload above.
  Tensor forward(Step& step, const LinearInput& x, const Tensor& out = Tensor());
  // How this layer quantises its input when the op before it may do so itself: an FP8 weight
  // kept FP8 (fp8()) with dynamic or static activations and a K the kernels take whole (a
  // multiple of 16); nullopt otherwise (16-bit weights, W8A16).
  std::optional<kernels::Fp8Quant> input_quant() const;
  // Codes and scales for `rows` inputs of this layer (input_quant() defined), in the step's
  // scratch.
  kernels::Fp8Input fp8_input(Step& step, int64_t rows) const;
  int64_t in_per_rank() const { return in_; }
  int64_t out_per_rank() const { return out_; }
  // The weight as stored: [out_per_rank, in_per_rank] of the weight dtype, or F8_E4M3 when
  // fp8() (then with weight_scale()).
  Parameter& weight() { return *weight_; }
  // The checkpoint's quantisation of this layer (unquantised when fp8 storage is off too).
  const LinearQuant& quant() const { return quant_; }
  // The weight stays FP8 on the device (products through kernels::linear_fp8).
  bool fp8() const { return fp8_; }
  Parameter* weight_scale() { return weight_scale_; }
  Parameter* input_scale() { return input_scale_; }
  // The FP8 weight for kernels::linear_fp8 (fp8() only).
  kernels::Fp8Weight fp8_weight() const;
  // Scheduling hints for this layer's products (kernels::LinearHints; values unchanged).
  void set_hints(const kernels::LinearHints& h) { hints_ = h; }
  Parameter* bias() { return bias_; }
  // For a [gate; up] weight: out [T, out_per_rank / 2] = silu(gate) * up in one kernel where the
  // backend has one for this size (kernels::linear_silu_mul); false, computing nothing, otherwise.
  bool forward_silu_mul(Tensor& out, const Tensor& x);
  // For a [q; k; v] weight: out = x · Wᵀ (+ b) with RoPE and the cache write fused where the
  // backend has one kernel for this size (kernels::linear_rope_kv); false, computing nothing,
  // otherwise.
  bool forward_rope_kv(Tensor& out, const Tensor& x, const kernels::QkvRope& r);
  virtual ~LinearBase() = default;

 protected:
  LinearBase(LayerContext& ctx, int64_t in_per_rank, int64_t out_per_rank)
      : ctx_(ctx), in_(in_per_rank), out_(out_per_rank) {}
  // `out` checked against this layer's output for `rows` inputs, or a new step tensor when
  // undefined.
  Tensor output(Step& step, int64_t rows, const Tensor& out) const;
  // y = x · Wᵀ (+ bias) by the stored form of the weight.
  void product(Tensor& y, const Tensor& x, const Tensor& bias);
  // Whether forward sums the rank's partial products over the ranks (then adds the bias).
  virtual bool reduces() const { return false; }
  // The bias the product adds itself: none when the sum over the ranks adds it once after.
  Tensor bias_in_product() const;
  // After the product: the sum over the ranks and the bias, where the layer reduces.
  void finish(Tensor& y);
  // Registers the weight (and bias) at `prefix` in the layer's method with loaders cutting this
  // rank's share by `layout` (parts' ckpt_name filled here), and for FP8 its weight_scale
  // (checkpoint weight_scale or weight_scale_inv) and input_scale (static activations). A
  // tensor-parallel cut that splits a scale block is an error naming the layer.
  void init_params(const std::string& prefix, LinearLayout layout, bool bias,
                   LinearStorage storage = LinearStorage::kAuto);
  LayerContext& ctx_;
  int64_t in_, out_;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;  // [out_per_rank]
  LinearQuant quant_;
  bool fp8_ = false;
  // fp8_: kBlock [ceil(out / bn), ceil(in / bk)]; kChannel [out] (also a fused kTensor layer,
  // each part's scale over its rows); kTensor [1]. F32. Otherwise, for an FP8 checkpoint
  // dequantised at load, a stand-in the scale arrives at.
  Parameter* weight_scale_ = nullptr;
  Parameter* input_scale_ = nullptr;  // [1] F32, the largest of the parts'
  kernels::LinearHints hints_;
};

// The same full weight on every rank.
class ReplicatedLinear : public LinearBase {
 public:
  ReplicatedLinear(LayerContext& ctx, const std::string& prefix, int64_t in, int64_t out, bool bias,
                   LinearStorage storage = LinearStorage::kAuto);
};

// Output features split over ranks; each rank computes its slice of y.
class ColumnParallelLinear : public LinearBase {
 public:
  ColumnParallelLinear(LayerContext& ctx, const std::string& prefix, int64_t in, int64_t out,
                       bool bias, LinearStorage storage = LinearStorage::kAuto);

 protected:
  ColumnParallelLinear(LayerContext& ctx, int64_t in, int64_t out_per_rank);
};

// Input features split over ranks; partial products are summed across ranks (all-reduce), then
// the (replicated) bias is added once.
class RowParallelLinear : public LinearBase {
 public:
  RowParallelLinear(LayerContext& ctx, const std::string& prefix, int64_t in, int64_t out,
                    bool bias, bool reduce_results = true,
                    LinearStorage storage = LinearStorage::kAuto);

 protected:
  bool reduces() const override { return ctx_.tp_size > 1 && reduce_; }

 private:
  bool reduce_;
};

// q, k and v projections fused into one weight [(Hq + 2 Hk) * D, hidden] per rank. Heads are split
// over ranks; when there are more ranks than kv heads, kv heads are replicated.
class QKVParallelLinear : public ColumnParallelLinear {
 public:
  QKVParallelLinear(LayerContext& ctx, const std::string& prefix, int64_t hidden, int64_t head_dim,
                    int64_t total_heads, int64_t total_kv_heads, bool bias);
  int64_t heads_per_rank() const { return heads_; }
  int64_t kv_heads_per_rank() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }

 private:
  int64_t head_dim_, heads_, kv_heads_, kv_replicas_;
};

// A key or a value projection alone (models that keep k_proj and v_proj apart), cut by kv heads
// as QKVParallelLinear cuts its k and v: split over ranks, or each head replicated over
// tp / kv heads ranks when there are fewer heads than ranks.
class KVHeadParallelLinear : public ColumnParallelLinear {
 public:
  KVHeadParallelLinear(LayerContext& ctx, const std::string& prefix, int64_t hidden,
                       int64_t head_dim, int64_t total_kv_heads, bool bias);
};

// Several column-parallel outputs fused along the output dimension (gate_proj + up_proj).
// Parts are named "0", "1", ... in order; each is split over the ranks.
class MergedColumnParallelLinear : public ColumnParallelLinear {
 public:
  MergedColumnParallelLinear(LayerContext& ctx, const std::string& prefix, int64_t in,
                             std::vector<int64_t> output_sizes, bool bias);
  // Part i is itself blocks[i]: consecutive row blocks of its checkpoint tensor, each split over
  // the ranks, so that this rank's output is its share of every block in order (Qwen3.5's
  // in_proj_qkv is {q, k, v}, each cut by head).
  MergedColumnParallelLinear(LayerContext& ctx, const std::string& prefix, int64_t in,
                             std::vector<std::vector<int64_t>> blocks, bool bias);
};

// The loader of a parameter cut by heads or channels for tensor parallelism: the checkpoint's
// values, flattened, are consecutive runs of run_values[i] values (the whole tensor as one run
// when empty), and this rank takes its 1/tp of each run, in order. Any dtype converts to the
// parameter's; a checkpoint with the wrong number of values is an error naming both.
WeightLoader rank_slice_loader(int rank, int tp, std::vector<int64_t> run_values = {});

// Writes rows [src_row, src_row + rows) of checkpoint tensor `ckpt` into rows [dst_row, ...) of
// `p` (1-D tensors: elements). Other dimensions must match exactly.
void param_load_rows(Parameter& p, const Tensor& ckpt, int64_t src_row, int64_t dst_row,
                     int64_t rows, int64_t expect_ckpt_rows);

}  // namespace atom
