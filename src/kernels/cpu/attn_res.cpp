#include "kernels/attn_res.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/access.h"

namespace atom::kernels::cpu {

void attn_res(Tensor& out, const Tensor& blocks, int64_t n, const Tensor& w, float eps) {
  const int64_t T = blocks.size(0), B = blocks.size(1), D = blocks.size(2);
  const float* wp = w.ptr<float>();
#pragma omp parallel for schedule(static) if (T * n * D > kParallelMin)
  for (int64_t t = 0; t < T; ++t) {
    const float* v = blocks.ptr<float>() + t * B * D;
    std::vector<float> score(static_cast<size_t>(n)), acc(static_cast<size_t>(D), 0.0f);
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      const float* r = v + j * D;
      float ss = 0.0f, dot = 0.0f;
      for (int64_t c = 0; c < D; ++c) {
        ss += r[c] * r[c];
        dot += r[c] * wp[c];
      }
      score[j] = dot / std::sqrt(ss / static_cast<float>(D) + eps);
      mx = std::max(mx, score[j]);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) sum += (score[j] = std::exp(score[j] - mx));
    for (int64_t j = 0; j < n; ++j) {
      const float p = score[j] / sum;
      const float* r = v + j * D;
      for (int64_t c = 0; c < D; ++c) acc[c] += p * r[c];
    }
    char* o = row_ptr(out, t);
    for (int64_t c = 0; c < D; ++c) store(o, out.dtype(), c, acc[c]);
  }
}

}  // namespace atom::kernels::cpu
