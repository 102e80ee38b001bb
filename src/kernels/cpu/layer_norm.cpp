#include "kernels/layer_norm.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/access.h"

namespace atom::kernels::cpu {

void layer_norm(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  check_rows("layer_norm", out, "out");
  check_rows("layer_norm", x, "x");
  const int64_t rows = x.size(0), dim = x.size(1);
  ATOM_CHECK(out.shape() == x.shape() && w.numel() == dim && (!b.defined() || b.numel() == dim),
             "layer_norm: x {} out {} w {} b {}", x.str(), out.str(), w.str(), b.str());
  std::vector<float> wf(static_cast<size_t>(dim)), bf(static_cast<size_t>(dim), 0.0f);
  for (int64_t i = 0; i < dim; ++i) {
    wf[i] = load(w.data(), w.dtype(), i);
    if (b.defined()) bf[i] = load(b.data(), b.dtype(), i);
  }
  std::vector<float> v(static_cast<size_t>(dim));
  for (int64_t r = 0; r < rows; ++r) {
    row_to_float(x, r, v.data());
    float mean = 0;
    for (float e : v) mean += e;
    mean /= static_cast<float>(dim);
    float var = 0;
    for (float e : v) var += (e - mean) * (e - mean);
    var /= static_cast<float>(dim);
    const float inv = 1.0f / std::sqrt(var + eps);
    for (int64_t i = 0; i < dim; ++i) v[i] = (v[i] - mean) * inv * wf[i] + bf[i];
    float_to_row(out, r, v.data());
  }
}

}  // namespace atom::kernels::cpu
