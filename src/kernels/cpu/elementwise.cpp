#include "kernels/elementwise.h"

#include <cmath>

#include <cstring>
#include <vector>

#include "kernels/cpu/access.h"

namespace atom::kernels::cpu {

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  check_rows("add", out, "out");
  check_rows("add", a, "a");
  check_rows("add", b, "b");
  ATOM_CHECK(a.shape() == b.shape() && out.shape() == a.shape(), "add: {} + {} -> {}", a.str(),
             b.str(), out.str());
  const int64_t R = a.size(0), C = a.size(1);
#pragma omp parallel for schedule(static) if (R * C > kParallelMin)
  for (int64_t r = 0; r < R; ++r) {
    const char* pa = row_ptr(a, r);
    const char* pb = row_ptr(b, r);
    char* po = row_ptr(out, r);
    for (int64_t c = 0; c < C; ++c)
      store(po, out.dtype(), c, load(pa, a.dtype(), c) + load(pb, b.dtype(), c));
  }
}

void add_gated(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& gate) {
  check_rows("add_gated", out, "out");
  check_rows("add_gated", a, "a");
  check_rows("add_gated", b, "b");
  check_rows("add_gated", gate, "gate");
  ATOM_CHECK(a.shape() == b.shape() && out.shape() == a.shape() && gate.size(0) == a.size(0) &&
                 gate.size(1) == 1,
             "add_gated: {} + sigmoid({}) * {} -> {}", a.str(), gate.str(), b.str(), out.str());
  const int64_t R = a.size(0), C = a.size(1);
#pragma omp parallel for schedule(static) if (R * C > kParallelMin)
  for (int64_t r = 0; r < R; ++r) {
    const float g = 1.0f / (1.0f + std::exp(-load(row_ptr(gate, r), gate.dtype(), 0)));
    const char* pa = row_ptr(a, r);
    const char* pb = row_ptr(b, r);
    char* po = row_ptr(out, r);
    for (int64_t c = 0; c < C; ++c)
      store(po, out.dtype(), c, load(pa, a.dtype(), c) + g * load(pb, b.dtype(), c));
  }
}

void gather_rows(Tensor& out, const Tensor& x, const Tensor& indices) {
  check_rows("gather_rows", out, "out");
  check_rows("gather_rows", x, "x");
  ATOM_CHECK(out.size(0) == indices.numel() && out.size(1) == x.size(1) && out.dtype() == x.dtype(),
             "gather_rows: x {} indices {} out {}", x.str(), indices.str(), out.str());
  const int32_t* idx = indices.ptr<int32_t>();
  const size_t row_bytes = static_cast<size_t>(x.size(1) * dtype_bits(x.dtype()) / 8);
  for (int64_t r = 0; r < out.size(0); ++r) {
    ATOM_CHECK(idx[r] >= 0 && idx[r] < x.size(0), "gather_rows: index {} of {}", idx[r], x.size(0));
    std::memcpy(row_ptr(out, r), row_ptr(x, idx[r]), row_bytes);
  }
}

void cast(Tensor& out, const Tensor& x) {
  check_rows("cast", out, "out");
  check_rows("cast", x, "x");
  ATOM_CHECK(out.shape() == x.shape(), "cast: {} -> {}", x.str(), out.str());
  for (int64_t r = 0; r < x.size(0); ++r) {
    const char* px = row_ptr(x, r);
    char* po = row_ptr(out, r);
    for (int64_t c = 0; c < x.size(1); ++c) store(po, out.dtype(), c, load(px, x.dtype(), c));
  }
}

void add_bias(Tensor& out, const Tensor& bias) {
  check_rows("add_bias", out, "out");
  ATOM_CHECK(bias.numel() == out.size(1), "add_bias: {} + {}", out.str(), bias.str());
  for (int64_t r = 0; r < out.size(0); ++r) {
    char* po = row_ptr(out, r);
    for (int64_t c = 0; c < out.size(1); ++c)
      store(po, out.dtype(), c, load(po, out.dtype(), c) + load(bias.data(), bias.dtype(), c));
  }
}

}  // namespace atom::kernels::cpu
