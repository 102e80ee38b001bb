// Host-side helpers of the CUDA entry points: tensors to launcher views, checks, launch errors.
#pragma once

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "core/tensor.h"
#include "kernels/activation.h"
#include "kernels/cuda/launch.h"

namespace atom::kernels::cuda {

inline cudaStream_t current_stream() { return ::atom::cuda_current_stream(); }

inline Elem elem_of(DType t, const char* op) {
  switch (t) {
    case DType::kF32:
      return Elem::kF32;
    case DType::kBF16:
      return Elem::kBF16;
    case DType::kF16:
      return Elem::kF16;
    default:
      fail("{}: dtype {} is not supported by the CUDA kernels", op, dtype_name(t));
  }
}

// A 2-D tensor whose rows may be strided but whose columns are contiguous.
inline void check_rows(const char* op, const Tensor& t, const char* name) {
  ATOM_CHECK(t.dim() == 2 && (t.size(1) <= 1 || t.stride(1) == 1),
             "{}: {} must be 2-D with contiguous rows, got {}", op, name, t.str());
}

inline Mat mat_of(const Tensor& t, const char* op) {
  Mat m;
  m.data = t.data();
  m.rows = t.size(0);
  m.cols = t.size(1);
  m.stride = t.size(0) > 1 ? t.stride(0) : t.size(1);
  m.type = elem_of(t.dtype(), op);
  return m;
}

// The residual stream of a fused residual add + norm over x: x's shape and dtype, rows
// contiguous (an error naming `op` otherwise).
inline Mat residual_mat(const char* op, const Tensor& residual, const Tensor& x) {
  check_rows(op, residual, "residual");
  ATOM_CHECK(residual.size(0) == x.size(0) && residual.size(1) == x.size(1) &&
                 residual.dtype() == x.dtype(),
             "{}: residual {} for x {}", op, residual.str(), x.str());
  return mat_of(residual, op);
}

// An activation as the kernels take it (moe_act_times in device_common.cuh): its kind, and
// SiTU's beta and linear_beta in the alpha and limit slots.
struct GluConstants {
  int act;
  float alpha, limit;
};
inline GluConstants glu_constants(const Glu& a) {
  const bool situ = a.kind == MoeActivation::kSitu;
  return {static_cast<int>(a.kind), situ ? a.beta : a.alpha, situ ? a.linear_beta : a.limit};
}

// Errors raised at launch (bad configuration, missing kernel image) name the op.
inline void launch_check(const char* op) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    fail("{}: CUDA kernel launch failed: {} ({})", op, cudaGetErrorName(e), cudaGetErrorString(e));
}

// Whether work issued on s is being captured into a CUDA graph (host reads and allocations are
// not allowed then).
inline bool stream_capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  return st != cudaStreamCaptureStatusNone;
}

inline bool is_i32(const Tensor& t) { return t.dtype() == DType::kI32 && t.is_contiguous(); }

}  // namespace atom::kernels::cuda
