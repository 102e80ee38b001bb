// Element-type conversion on the host, and "copy with conversion" into a tensor on any device.
#pragma once

#include "core/tensor.h"

namespace atom {

// dst = src converted to dst's dtype. Shapes must match; src must be on the CPU (any strides);
// dst may be on any device but must be contiguous. Float types convert among F32/BF16/F16/F64;
// other types need equal dtypes.
void tensor_assign(Tensor& dst, const Tensor& src);

// A CPU copy of `src` (any device) with elements converted to `dtype`.
Tensor tensor_cast_cpu(const Tensor& src, DType dtype);

// Reads one element as float (CPU tensors, F32/BF16/F16/F64 and integer types).
float tensor_get_float(const Tensor& t, int64_t flat_index);

}  // namespace atom
