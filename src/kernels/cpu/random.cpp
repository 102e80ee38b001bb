#include "kernels/random.h"

#include "kernels/cpu/access.h"

namespace atom::kernels::cpu {

void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi) {
  ATOM_CHECK(t.is_contiguous(), "fill_uniform: {} must be contiguous", t.str());
  const int64_t n = t.numel();
  const DType dt = t.dtype();
  ATOM_CHECK(dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16 || dt == DType::kF8E4M3,
             "fill_uniform: dtype {}", dtype_name(dt));
  void* p = t.data();
  const float span = hi - lo;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    store(p, dt, i, lo + span * random_uniform(seed, static_cast<uint64_t>(i)));
}

void fill_uniform_bytes(Tensor& t, uint64_t seed, int lo, int hi) {
  const int64_t n = t.numel();
  uint8_t* p = static_cast<uint8_t*>(t.data());
  const float span = static_cast<float>(hi - lo + 1);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int v = lo + static_cast<int>(span * random_uniform(seed, static_cast<uint64_t>(i)));
    p[i] = static_cast<uint8_t>(v > hi ? hi : v);
  }
}

}  // namespace atom::kernels::cpu
