// What every cuBLASLt call of atom shares (linear.cpp's BF16/F16 GEMMs, linear_fp8_cublaslt.cpp's
// FP8 GEMMs): one handle per device and one workspace per (device, stream), made on first use
// and kept for the process (CUDA graphs capture the workspace's address). Calls on one stream run
// in its order, so they can share its workspace.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "core/dtype.h"

namespace atom::kernels::cuda {

inline constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

// cuBLAS's element type for F32, BF16 and F16; an Error naming `op` for any other dtype.
cudaDataType_t cuda_data_type(DType t, const char* op);

// The cuBLASLt handle of `device`, or nullptr with `why` set when cublasLtCreate fails.
cublasLtHandle_t lt_handle(int device, std::string* why);

// The workspace (kLtWorkspaceBytes) of (device, stream). Made when there is none and `allocate`
// is true; nullptr when there is none and it is false (nothing may be allocated while a stream
// is being captured).
void* lt_workspace(int device, cudaStream_t stream, bool allocate);

}  // namespace atom::kernels::cuda
