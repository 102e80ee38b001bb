// Host tensors for tests: seeded random values and int32 index vectors.
#pragma once

#include <cstring>
#include <vector>

#include "core/half.h"
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

// Element i of a contiguous CPU tensor of F32 or BF16.
inline float f32_or_bf16_at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kF32 ? t.ptr<float>()[i] : bf16_to_f32(t.ptr<uint16_t>()[i]);
}

}  // namespace atom::test
