// CUDA error checking and device allocation. Only included when ATOM_HAVE_CUDA is set.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "core/device.h"
#include "core/error.h"

#define CUDA_CHECK(expr)                                                                          \
  do {                                                                                            \
    cudaError_t atom_err_ = (expr);                                                               \
    if (atom_err_ != cudaSuccess) {                                                               \
      throw ::atom::Error(fmt::format("{}:{}: CUDA error {} ({}) in {}", __FILE__, __LINE__,      \
                                      cudaGetErrorName(atom_err_), cudaGetErrorString(atom_err_), \
                                      #expr));                                                    \
    }                                                                                             \
  } while (0)

namespace atom {
// Device memory from a per-device cache of cudaMalloc blocks (no managed memory): a freed block
// is kept and handed out again for a request of about its size.
std::shared_ptr<Storage> cuda_storage_alloc(size_t nbytes, Device device);
// Bytes the cache holds that no tensor uses.
size_t cuda_cached_bytes(int device);
}  // namespace atom
