// CUDA entry points of argmax and sample (kernels in sampling.cu).
#include "kernels/sampling.h"

#include "kernels/cuda/host_common.h"

namespace atom::kernels::cuda {

void argmax(Tensor& ids, const Tensor& logits) {
  check_rows("argmax", logits, "logits");
  ATOM_CHECK(ids.numel() == logits.size(0) && is_i32(ids) && logits.size(1) > 0,
             "argmax: ids {} logits {}", ids.str(), logits.str());
  launch_argmax(ids.ptr<int32_t>(), mat_of(logits, "argmax"), current_stream());
  launch_check("argmax");
}

void sample(Tensor& ids, const Tensor& logits, const Tensor& rows) {
  check_rows("sample", logits, "logits");
  const int64_t R = logits.size(0);
  ATOM_CHECK(ids.numel() == R && is_i32(ids) && logits.dtype() == DType::kF32 && logits.size(1) > 0,
             "sample: ids {} logits {}", ids.str(), logits.str());
  ATOM_CHECK(rows.is_contiguous() &&
                 rows.nbytes() == static_cast<uint64_t>(R) * sizeof(SamplingRow) &&
                 (reinterpret_cast<uintptr_t>(rows.data()) & 7) == 0,
             "sample: rows {} for {} logits rows", rows.str(), R);
  launch_sample(ids.ptr<int32_t>(), mat_of(logits, "sample"), rows.data(), current_stream());
  launch_check("sample");
}

void mask_logits(Tensor& logits, const Tensor& masks, const Tensor& index) {
  launch_mask_logits(mat_of(logits, "mask_logits"), masks.ptr<uint64_t>(), masks.size(1),
                     masks.size(0), index.ptr<int32_t>(), current_stream());
  launch_check("mask_logits");
}

}  // namespace atom::kernels::cuda
