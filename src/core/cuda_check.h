// CUDA error checking and device allocation. Only included when ATOM_HAVE_CUDA is set.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "core/device.h"
#include "core/error.h"

#define CUDA_CHECK(expr)                                                                   \
  do {                                                                                     \
    cudaError_t atom_err_ = (expr);                                                        \
    if (atom_err_ != cudaSuccess) {                                                        \
      throw ::atom::Error(fmt::format("{}:{}: CUDA error {} ({}) in {}", __FILE__, __LINE__, \
                                      cudaGetErrorName(atom_err_),                         \
                                      cudaGetErrorString(atom_err_), #expr));              \
    }                                                                                      \
  } while (0)

namespace atom {
std::shared_ptr<Storage> cuda_storage_alloc(size_t nbytes, Device device);
}
