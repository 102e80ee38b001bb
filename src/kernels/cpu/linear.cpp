#include "kernels/linear.h"

#include <vector>

#include "kernels/cpu/access.h"

namespace atom::kernels::cpu {

void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias) {
  check_rows("linear", out, "out");
  check_rows("linear", x, "x");
  ATOM_CHECK(w.dim() == 2 && w.is_contiguous(), "linear: weight must be contiguous 2-D, got {}",
             w.str());
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  ATOM_CHECK(w.size(1) == K && out.size(0) == M && out.size(1) == N,
             "linear: x {} · w {}ᵀ -> out {}", x.str(), w.str(), out.str());
  ATOM_CHECK(!bias.defined() || (bias.numel() == N), "linear: bias {} for N={}", bias.str(), N);

  // x as contiguous floats.
  std::vector<float> xf(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m) row_to_float(x, m, xf.data() + m * K);
  std::vector<float> bf;
  if (bias.defined()) {
    bf.resize(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) bf[n] = load(bias.data(), bias.dtype(), n);
  }
  std::vector<float> of(static_cast<size_t>(M * N));

  constexpr int64_t kRows = 16;
  const int64_t blocks = (N + kRows - 1) / kRows;
  const bool w_f32 = w.dtype() == DType::kF32;
  const void* w_data = w.data();
#pragma omp parallel if (M * N * K > kParallelMin * 16)
  {
    std::vector<float> wbuf(w_f32 ? 0 : static_cast<size_t>(kRows * K));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n0 = b * kRows, n1 = std::min(N, n0 + kRows);
      const float* wb;
      if (w_f32) {
        wb = static_cast<const float*>(w_data) + n0 * K;
      } else if (w.dtype() == DType::kBF16) {
        const uint16_t* src = static_cast<const uint16_t*>(w_data) + n0 * K;
        for (int64_t i = 0; i < (n1 - n0) * K; ++i) wbuf[i] = bf16_to_f32(src[i]);
        wb = wbuf.data();
      } else {
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t k = 0; k < K; ++k)
            wbuf[(n - n0) * K + k] = load(w_data, w.dtype(), n * K + k);
        wb = wbuf.data();
      }
      for (int64_t m = 0; m < M; ++m) {
        const float* xr = xf.data() + m * K;
        for (int64_t n = n0; n < n1; ++n) {
          float v = dot(xr, wb + (n - n0) * K, K);
          if (!bf.empty()) v += bf[n];
          of[m * N + n] = v;
        }
      }
    }
  }
  for (int64_t m = 0; m < M; ++m) float_to_row(out, m, of.data() + m * N);
}

}  // namespace atom::kernels::cpu
