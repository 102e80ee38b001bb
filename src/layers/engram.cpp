#include "layers/engram.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "kernels/elementwise.h"
#include "kernels/engram.h"

namespace atom {

Engram::Engram(LayerContext& ctx, const std::string& prefix, const EngramHash& hash,
               int64_t layer_id, int64_t hidden, int64_t hc_mult, double eps, bool fp8_table)
    : hash_(hash),
      layer_id_(layer_id),
      hidden_(hidden),
      hc_(hc_mult),
      width_(hash.num_hash_heads() * hash.config().head_dim),
      eps_(static_cast<float>(eps)),
      act_dtype_(ctx.act_dtype),
      wkv_(ctx, prefix + ".wkv", hash.num_hash_heads() * hash.config().head_dim,
           (hc_mult + 1) * hidden, false) {
  ATOM_CHECK(hidden > 0 && hc_mult > 0, "{}: hidden {} and hc_mult {} must be positive", prefix,
             hidden, hc_mult);
  const std::vector<int64_t>& sizes = hash.head_sizes(layer_id);  // an Error if not an engram layer
  rows_ = 0;
  for (int64_t s : sizes) rows_ += s;
  const int64_t d = hash.config().head_dim;
  ATOM_CHECK(!fp8_table || d % 32 == 0,
             "{}: an FP8 table has a scale per 32 values of a row; head_dim {} is not a multiple "
             "of 32",
             prefix, d);
  table_ = &ctx.params.add(prefix + ".embed.weight",
                           Tensor::zeros({rows_, d}, fp8_table ? DType::kF8E4M3 : DType::kF32));
  if (fp8_table)
    table_scale_ = &ctx.params.add(prefix + ".embed.weight_scale",
                                   Tensor::zeros({rows_, d / 32}, DType::kE8M0));
  k_weight_ =
      &ctx.params.add(prefix + ".k_weight", ctx.param_tensor({hc_mult, hidden}, DType::kF32));
  q_weight_ =
      &ctx.params.add(prefix + ".q_weight", ctx.param_tensor({hc_mult, hidden}, DType::kF32));
}

void Engram::embed(std::span<const int64_t> ids, int64_t pad_id, size_t begin,
                   std::span<float> out) const {
  ATOM_CHECK(begin <= ids.size(), "Engram: begin {} past {} ids", begin, ids.size());
  const int64_t n = static_cast<int64_t>(ids.size() - begin), heads = hash_.num_hash_heads();
  const int64_t d = hash_.config().head_dim;
  ATOM_CHECK(static_cast<int64_t>(out.size()) == n * width_,
             "Engram: {} floats for {} positions of width {}", out.size(), n, width_);
  const std::vector<int64_t> rows = hash_.rows(ids, layer_id_, pad_id, begin);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t r = rows[static_cast<size_t>(t * heads + h)];
      ATOM_CHECK(r >= 0 && r < rows_, "Engram: table row {} of {}", r, rows_);
      float* o = out.data() + t * width_ + h * d;
      if (!table_scale_) {
        const float* table = table_->data().ptr<float>();
        std::copy(table + r * d, table + (r + 1) * d, o);
        continue;
      }
      // FP8 e4m3 codes times 2^(e - 127), one exponent per 32 values.
      const uint8_t* codes = table_->data().ptr<uint8_t>() + r * d;
      const uint8_t* exps = table_scale_->data().ptr<uint8_t>() + r * (d / 32);
      for (int64_t c = 0; c < d; ++c)
        o[c] = f8e4m3_to_f32(codes[c]) * std::ldexp(1.0f, int{exps[c / 32]} - 127);
    }
}

void Engram::add(Step& step, Tensor& streams, const Tensor& embeddings) {
  const int64_t T = streams.size(0);
  ATOM_CHECK(streams.dim() == 3 && streams.size(1) == hc_ && streams.size(2) == hidden_ &&
                 streams.dtype() == DType::kF32 && streams.is_contiguous(),
             "Engram: streams {} must be contiguous F32 [T, {}, {}]", streams.str(), hc_, hidden_);
  ATOM_CHECK(embeddings.shape() == Shape({T, width_}) && embeddings.dtype() == DType::kF32 &&
                 embeddings.device().is_cpu() && embeddings.is_contiguous(),
             "Engram: embeddings {} must be contiguous F32 [{}, {}] on the CPU", embeddings.str(),
             T, width_);
  Tensor e = embeddings;
  if (!streams.device().is_cpu()) {  // the rows up to the device, in the activations' dtype
    Tensor up = step.empty({T, width_}, DType::kF32);
    up.copy_from(embeddings);
    e = step.empty({T, width_}, act_dtype_);
    kernels::cast(e, up);
  }
  const Tensor kv = wkv_.forward(step, e);  // [T, (hc + 1) H]
  kernels::engram_gate_add(streams, kv, k_weight_->data(), q_weight_->data(), eps_);
}

}  // namespace atom
