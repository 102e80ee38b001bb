#include "layers/rotary.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/rope.h"

namespace atom {

namespace {
// transformers computes the default frequencies in float32: 1 / base^(float(2i) / dim).
std::vector<float> default_inv_freq(double theta, int dim) {
  std::vector<float> f(static_cast<size_t>(dim / 2));
  const float base = static_cast<float>(theta);
  for (int i = 0; i < dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
    f[i] = 1.0f / std::pow(base, e);
  }
  return f;
}

double yarn_mscale(double scale, double m) {
  return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}
}  // namespace

RopeTables rope_tables(const RopeConfig& r, int dim, int64_t max_pos) {
  RopeTables t;
  t.inv_freq = default_inv_freq(r.theta, dim);
  if (r.type == "default") return t;
  if (r.type == "linear") {
    for (auto& f : t.inv_freq) f = f / static_cast<float>(r.factor);
    return t;
  }
  if (r.type == "llama3") {
    const double orig = static_cast<double>(*r.original_max_position_embeddings);
    const double low_wl = orig / r.low_freq_factor, high_wl = orig / r.high_freq_factor;
    for (auto& f : t.inv_freq) {
      const double wl = 2 * M_PI / f;
      if (wl < high_wl) continue;
      if (wl > low_wl) {
        f = static_cast<float>(f / r.factor);
      } else {
        const double s = (orig / wl - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        f = static_cast<float>((1 - s) * f / r.factor + s * f);
      }
    }
    return t;
  }
  if (r.type == "yarn") {
    const double orig = static_cast<double>(r.original_max_position_embeddings.value_or(max_pos));
    const double factor = r.factor;
    if (r.attention_factor) {
      t.attention_factor = static_cast<float>(*r.attention_factor);
    } else if (r.mscale && r.mscale_all_dim && *r.mscale != 0 && *r.mscale_all_dim != 0) {
      t.attention_factor = static_cast<float>(yarn_mscale(factor, *r.mscale) /
                                              yarn_mscale(factor, *r.mscale_all_dim));
    } else {
      t.attention_factor = static_cast<float>(yarn_mscale(factor, 1.0));
    }
    auto corr = [&](double rot) {
      return dim * std::log(orig / (rot * 2 * M_PI)) / (2 * std::log(r.theta));
    };
    double low = corr(r.beta_fast), high = corr(r.beta_slow);
    if (r.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
    for (int i = 0; i < dim / 2; ++i) {
      const float pos_freq = std::pow(static_cast<float>(r.theta),
                                      static_cast<float>(2 * i) / static_cast<float>(dim));
      const float extra = 1.0f / pos_freq;
      const float inter = 1.0f / (static_cast<float>(factor) * pos_freq);
      const float ramp = std::clamp(static_cast<float>((i - low) / (high - low)), 0.0f, 1.0f);
      const float extra_factor = 1.0f - ramp;
      t.inv_freq[i] = inter * (1.0f - extra_factor) + extra * extra_factor;
    }
    return t;
  }
  fail("rope type '{}' is not supported yet (supported: default, linear, llama3, yarn)", r.type);
}

RotaryEmbedding::RotaryEmbedding(LayerContext& ctx, int head_dim, const RopeConfig& rope,
                                 int64_t max_position_embeddings, bool interleaved)
    : head_dim_(head_dim), interleaved_(interleaved) {
  rot_dim_ = static_cast<int>(head_dim * rope.partial_rotary_factor);
  ATOM_CHECK(rot_dim_ > 0 && rot_dim_ % 2 == 0 && rot_dim_ <= head_dim,
             "rotary dimension {} for head_dim {}", rot_dim_, head_dim);
  const RopeTables t = rope_tables(rope, rot_dim_, max_position_embeddings);
  scale_ = t.attention_factor;
  inv_freq_ = inv_freq_tensor(t.inv_freq, ctx.device);
}

Tensor inv_freq_tensor(const std::vector<float>& inv_freq, Device device) {
  Tensor host = Tensor::empty({static_cast<int64_t>(inv_freq.size())}, DType::kF32);
  std::copy(inv_freq.begin(), inv_freq.end(), host.ptr<float>());
  return host.to(device);
}

void RotaryEmbedding::forward(Step& step, Tensor& q, Tensor& k) const {
  kernels::RopeArgs a;
  a.head_dim = head_dim_;
  a.rot_dim = rot_dim_;
  a.scale = scale_;
  a.interleaved = interleaved_;
  kernels::rope(q, k, step.batch.dev.positions, inv_freq_, a);
}

void RotaryEmbedding::forward_and_cache(Step& step, Tensor& q, Tensor& k, const Tensor& v,
                                        Tensor& k_cache, Tensor& v_cache, kernels::KvScales scales,
                                        const kernels::QkNorm* norm) const {
  kernels::RopeArgs a;
  a.head_dim = head_dim_;
  a.rot_dim = rot_dim_;
  a.scale = scale_;
  a.interleaved = interleaved_;
  kernels::rope_kv_cache_write(q, k, v, step.batch.dev.positions, inv_freq_, a, k_cache, v_cache,
                               step.batch.dev.slot_mapping, scales, norm);
}

}  // namespace atom
