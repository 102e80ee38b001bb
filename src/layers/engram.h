// One Engram module of DeepSeek-V4.1 (the V4.1 report §2.4.2, as ROCm/ATOM's
// atom/model_ops/engram_layer.py writes it): a gated read of n-gram embedding tables into each
// hyper-connection stream. For position t with residual streams x_j [hc_mult, H]:
//   e      = the table rows of t's hash heads (layers/engram_hash.h), concatenated
//            [heads · head_dim] (DeepSeek-V4.1: 3 orders × 8 heads × 256 = 6144)
//   k_0 .. k_{hc-1}, v = wkv(e)                  (one fused projection: hc_mult keys, then v)
//   g_j    = <rms(k_j) ⊙ k_weight_j, rms(x_j) ⊙ q_weight_j> / √H,   rms(y) = y / √(mean y² + eps)
//   g_j    = sign(g_j) · √max(|g_j|, 1e-6)
//   out_j  = sigmoid(g_j) · v                     (the model adds it to stream j)
// in fp32, eps 1e-20 (the gains used as they are, not 1 + w). No short convolution (V4.1 has
// none). Parameters under `prefix`: embed.weight [table rows, head_dim], wkv.weight
// [(hc_mult + 1) H, heads · head_dim], k_weight and q_weight [hc_mult, H]. The table is held on
// the CPU (the reference's tables, 98 GB of FP8 each in the release, are read on the host too):
// F32, or the release's FP8 with e8m0 scales per 32 values (fp8_table), decoded row by row as
// read; the rest where the model is: on CUDA the step's rows are copied up, wkv and the gate
// (kernels::engram_gate_add) run on the device.
#pragma once

#include <span>
#include <string>

#include "layers/context.h"
#include "layers/engram_hash.h"
#include "layers/linear.h"

namespace atom {

class Engram {
 public:
  // fp8_table: the table as DeepSeek-V4.1's release stores it, F8_E4M3 "embed.weight" [rows,
  // head_dim] with F8_E8M0 "embed.weight_scale" [rows, head_dim / 32] (one power of two per 32
  // values of a row); kept so, each row read decoded.
  Engram(LayerContext& ctx, const std::string& prefix, const EngramHash& hash, int64_t layer_id,
         int64_t hidden, int64_t hc_mult, double eps = 1e-20, bool fp8_table = false);

  int64_t width() const { return width_; }  // heads · head_dim

  // The embeddings [ids.size() - begin, width()] F32 of positions [begin, ids.size()) of one
  // sequence of compressed ids (the ids before `begin` are the n-grams' history), written to
  // `out` (row-major).
  void embed(std::span<const int64_t> ids, int64_t pad_id, size_t begin,
             std::span<float> out) const;

  // streams [T, hc_mult, H] F32 (the model's device) += the gated read of embeddings [T,
  // width()] F32 (on the CPU, as embed() writes them).
  void add(Step& step, Tensor& streams, const Tensor& embeddings);

 private:
  const EngramHash& hash_;
  int64_t layer_id_, hidden_, hc_, width_, rows_;
  float eps_;
  DType act_dtype_;
  Parameter* table_;                  // [rows, head_dim] F32 (or F8_E4M3) on the CPU
  Parameter* table_scale_ = nullptr;  // fp8_table: [rows, head_dim / 32] E8M0
  ReplicatedLinear wkv_;
  Parameter *k_weight_, *q_weight_;  // [hc, H]
};

}  // namespace atom
