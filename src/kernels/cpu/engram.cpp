// DeepSeek-V4.1's Engram gate on the CPU (kernels/engram.h): fp32, the mean squares in double.
#include "kernels/engram.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/access.h"

namespace atom::kernels::cpu {

void engram_gate_add(Tensor& streams, const Tensor& kv, const Tensor& k_weight,
                     const Tensor& q_weight, float eps) {
  engram_gate_check(streams, kv, k_weight, q_weight);
  const int64_t T = streams.size(0), hc = streams.size(1), H = streams.size(2);
  float* x = streams.ptr<float>();
  const float* kw = k_weight.ptr<float>();
  const float* qw = q_weight.ptr<float>();
  auto inv_rms = [&](const float* v) {
    double ss = 0;
    for (int64_t c = 0; c < H; ++c) ss += static_cast<double>(v[c]) * v[c];
    return 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(H)) + eps);
  };
  const float inv_sqrt_h = 1.0f / std::sqrt(static_cast<float>(H));
#pragma omp parallel for schedule(static) if (T * hc * H > (1 << 15))
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> row(static_cast<size_t>((hc + 1) * H));
    row_to_float(kv, t, row.data());
    const float* v = row.data() + hc * H;
    for (int64_t j = 0; j < hc; ++j) {
      const float* kj = row.data() + j * H;
      float* xj = x + (t * hc + j) * H;
      const float ik = inv_rms(kj), iq = inv_rms(xj);
      float g = 0;
      for (int64_t c = 0; c < H; ++c)
        g += (kj[c] * ik * kw[j * H + c]) * (xj[c] * iq * qw[j * H + c]);
      g *= inv_sqrt_h;
      const float a = std::sqrt(std::max(std::abs(g), 1e-6f));
      g = g > 0 ? a : g < 0 ? -a : 0.0f;
      const float s = 1.0f / (1.0f + std::exp(-g));
      for (int64_t c = 0; c < H; ++c) xj[c] += s * v[c];
    }
  }
}

}  // namespace atom::kernels::cpu
