#include "kernels/activation.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/access.h"

namespace atom::kernels::cpu {

void glu(Tensor& out, const Tensor& x, const Glu& a) {
  check_rows("glu", out, "out");
  check_rows("glu", x, "x");
  const int64_t M = x.size(0), I = out.size(1);
  ATOM_CHECK(out.size(0) == M && x.size(1) == 2 * I, "glu: x {} out {}", x.str(), out.str());
#pragma omp parallel if (M * I > kParallelMin)
  {
    std::vector<float> v(static_cast<size_t>(2 * I));
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      row_to_float(x, m, v.data());
      for (int64_t i = 0; i < I; ++i) v[i] = glu_value(v[i], v[I + i], a);
      char* o = row_ptr(out, m);
      for (int64_t i = 0; i < I; ++i) store(o, out.dtype(), i, v[i]);
    }
  }
}

}  // namespace atom::kernels::cpu
