// Host tensors for tests: seeded random values and int32 index vectors.
#pragma once

#include <cstring>
#include <vector>

#include "core/tensor.h"
#include "kernels/random.h"

namespace atom::test {

// A CPU tensor of seeded uniform values in [lo, hi), rounded to dtype.
inline Tensor random_cpu(Shape shape, DType dtype, uint64_t seed, float lo = -1.0f,
                         float hi = 1.0f) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  kernels::fill_uniform(t, seed, lo, hi);
  return t;
}

// A CPU I32 tensor holding v.
inline Tensor i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

}  // namespace atom::test
