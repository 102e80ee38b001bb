#include "kernels/random.h"

#include "kernels/cpu/access.h"

namespace atom::kernels::cpu {

void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi) {
  ATOM_CHECK(t.is_contiguous(), "fill_uniform: {} must be contiguous", t.str());
  const int64_t n = t.numel();
  const DType dt = t.dtype();
  ATOM_CHECK(dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16, "fill_uniform: dtype {}",
             dtype_name(dt));
  void* p = t.data();
  const float span = hi - lo;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    store(p, dt, i, lo + span * random_uniform(seed, static_cast<uint64_t>(i)));
}

}  // namespace atom::kernels::cpu
