#include "layers/engram.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/half.h"

namespace atom {

Engram::Engram(LayerContext& ctx, const std::string& prefix, const EngramHash& hash,
               int64_t layer_id, int64_t hidden, int64_t hc_mult, double eps, bool fp8_table)
    : hash_(hash),
      layer_id_(layer_id),
      hidden_(hidden),
      hc_(hc_mult),
      width_(hash.num_hash_heads() * hash.config().head_dim),
      eps_(static_cast<float>(eps)),
      wkv_(ctx, prefix + ".wkv", hash.num_hash_heads() * hash.config().head_dim,
           (hc_mult + 1) * hidden, false) {
  ATOM_CHECK(ctx.device.is_cpu() && ctx.act_dtype == DType::kF32,
             "{}: Engram runs on the CPU backend (F32) only so far", prefix);
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

Tensor Engram::forward(Step& step, const Tensor& streams, const Tensor& embeddings) {
  const int64_t T = streams.size(0), H = hidden_, hc = hc_;
  ATOM_CHECK(streams.dim() == 3 && streams.size(1) == hc && streams.size(2) == H &&
                 streams.dtype() == DType::kF32 && streams.is_contiguous(),
             "Engram: streams {} must be contiguous F32 [T, {}, {}]", streams.str(), hc, H);
  ATOM_CHECK(embeddings.shape() == Shape({T, width_}) && embeddings.dtype() == DType::kF32,
             "Engram: embeddings {} must be F32 [{}, {}]", embeddings.str(), T, width_);
  const Tensor kv = wkv_.forward(step, embeddings).contiguous();  // [T, (hc + 1) H]
  Tensor out = Tensor::empty({T, hc, H}, DType::kF32);
  const float* x = streams.ptr<float>();
  const float* k = kv.ptr<float>();
  const float* kw = k_weight_->data().ptr<float>();
  const float* qw = q_weight_->data().ptr<float>();
  float* o = out.ptr<float>();
  auto inv_rms = [&](const float* v) {
    double ss = 0;
    for (int64_t c = 0; c < H; ++c) ss += static_cast<double>(v[c]) * v[c];
    return 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(H)) + eps_);
  };
  const float inv_sqrt_h = 1.0f / std::sqrt(static_cast<float>(H));
#pragma omp parallel for schedule(static) if (T * hc * H > (1 << 15))
  for (int64_t t = 0; t < T; ++t) {
    const float* row = k + t * (hc + 1) * H;
    const float* v = row + hc * H;
    for (int64_t j = 0; j < hc; ++j) {
      const float* kj = row + j * H;
      const float* xj = x + (t * hc + j) * H;
      const float ik = inv_rms(kj), iq = inv_rms(xj);
      float g = 0;
      for (int64_t c = 0; c < H; ++c)
        g += (kj[c] * ik * kw[j * H + c]) * (xj[c] * iq * qw[j * H + c]);
      g *= inv_sqrt_h;
      const float a = std::sqrt(std::max(std::abs(g), 1e-6f));
      g = g > 0 ? a : g < 0 ? -a : 0.0f;
      const float s = 1.0f / (1.0f + std::exp(-g));
      float* oj = o + (t * hc + j) * H;
      for (int64_t c = 0; c < H; ++c) oj[c] = s * v[c];
    }
  }
  return out;
}

}  // namespace atom
