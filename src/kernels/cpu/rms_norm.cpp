#include "kernels/rms_norm.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/access.h"

namespace atom::kernels::cpu {

void rms_norm(Tensor& out, const Tensor& x, Tensor* residual, const Tensor& w, float eps,
              RmsNormKind kind) {
  check_rows("rms_norm", out, "out");
  check_rows("rms_norm", x, "x");
  // Each row holds `groups` independent vectors of w.numel() (per-head norms use groups > 1).
  const int64_t rows = x.size(0), width = x.size(1), dim = w.numel();
  ATOM_CHECK(dim > 0 && width % dim == 0 && out.size(0) == rows && out.size(1) == width,
             "rms_norm: x {} out {} w {}", x.str(), out.str(), w.str());
  const int64_t groups = width / dim;
  if (residual) {
    check_rows("rms_norm", *residual, "residual");
    ATOM_CHECK(residual->size(0) == rows && residual->size(1) == width, "rms_norm: residual {}",
               residual->str());
  }
  std::vector<float> wf(static_cast<size_t>(dim));
  for (int64_t i = 0; i < dim; ++i) wf[i] = load(w.data(), w.dtype(), i);
#pragma omp parallel if (rows * width > kParallelMin)
  {
    std::vector<float> v(static_cast<size_t>(width));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      row_to_float(x, r, v.data());
      if (residual) {
        std::vector<float> res(static_cast<size_t>(width));
        row_to_float(*residual, r, res.data());
        for (int64_t i = 0; i < width; ++i) v[i] += res[i];
        float_to_row(*residual, r, v.data());
        // Normalise what the residual stream holds (rounded to its dtype), as an unfused add would.
        row_to_float(*residual, r, v.data());
      }
      for (int64_t g = 0; g < groups; ++g) {
        float* vg = v.data() + g * dim;
        float ss = 0;
        for (int64_t i = 0; i < dim; ++i) ss += vg[i] * vg[i];
        const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
        for (int64_t i = 0; i < dim; ++i) {
          float n = vg[i] * inv;
          if (kind == RmsNormKind::kLlama) {
            // transformers rounds the normalised value to the activation dtype before the weight.
            vg[i] = wf[i] * round_to(out.dtype(), n);
          } else if (kind == RmsNormKind::kGptOss) {
            vg[i] = wf[i] * n;
          } else {
            vg[i] = n * (1.0f + wf[i]);
          }
        }
      }
      float_to_row(out, r, v.data());
    }
  }
}

}  // namespace atom::kernels::cpu
