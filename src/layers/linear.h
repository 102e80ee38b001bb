// Parallel linear layers. Each owns its weight loader: given a checkpoint tensor of the full
// (unsharded) layer, it writes this rank's slice. Weights are [out, in] as in transformers.
#pragma once

#include <string>
#include <vector>

#include "kernels/linear.h"
#include "layers/context.h"

namespace atom {

class LinearBase {
 public:
  // y = x · Wᵀ (+ b)   x [T, in_per_rank] -> [T, out_per_rank], written into `out` when it is
  // given (a caller-owned buffer), else into a new tensor of the step.
  virtual Tensor forward(Step& step, const Tensor& x, const Tensor& out = Tensor());
  int64_t in_per_rank() const { return in_; }
  int64_t out_per_rank() const { return out_; }
  Parameter& weight() { return *weight_; }
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
  // `out` checked against this layer's output for x, or a new step tensor when undefined.
  Tensor output(Step& step, const Tensor& x, const Tensor& out) const;
  LayerContext& ctx_;
  int64_t in_, out_;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;  // [out_per_rank]
  kernels::LinearHints hints_;
};

// The same full weight on every rank.
class ReplicatedLinear : public LinearBase {
 public:
  ReplicatedLinear(LayerContext& ctx, const std::string& prefix, int64_t in, int64_t out,
                   bool bias);
};

// Output features split over ranks; each rank computes its slice of y.
class ColumnParallelLinear : public LinearBase {
 public:
  ColumnParallelLinear(LayerContext& ctx, const std::string& prefix, int64_t in, int64_t out,
                       bool bias);

 protected:
  ColumnParallelLinear(LayerContext& ctx, int64_t in, int64_t out_per_rank);
};

// Input features split over ranks; partial products are summed across ranks (all-reduce), then
// the (replicated) bias is added once.
class RowParallelLinear : public LinearBase {
 public:
  RowParallelLinear(LayerContext& ctx, const std::string& prefix, int64_t in, int64_t out,
                    bool bias, bool reduce_results = true);
  Tensor forward(Step& step, const Tensor& x, const Tensor& out = Tensor()) override;

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

// Several column-parallel outputs fused along the output dimension (gate_proj + up_proj).
// Parts are named "0", "1", ... in order.
class MergedColumnParallelLinear : public ColumnParallelLinear {
 public:
  MergedColumnParallelLinear(LayerContext& ctx, const std::string& prefix, int64_t in,
                             std::vector<int64_t> output_sizes, bool bias);

 private:
  std::vector<int64_t> sizes_;
};

// Writes rows [src_row, src_row + rows) of checkpoint tensor `ckpt` into rows [dst_row, ...) of
// `p` (1-D tensors: elements). Other dimensions must match exactly.
void param_load_rows(Parameter& p, const Tensor& ckpt, int64_t src_row, int64_t dst_row,
                     int64_t rows, int64_t expect_ckpt_rows);

}  // namespace atom
