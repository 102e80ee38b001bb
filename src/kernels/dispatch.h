// Kernel entry points take tensor views and dispatch on the device of their output. There is no
// silent fallback from CUDA to the CPU: an op without a CUDA kernel fails naming itself.
#pragma once

#include "core/error.h"
#include "core/tensor.h"

namespace atom::kernels {

// All tensors given must live on `dev`.
inline void check_same_device(const char* op, Device dev, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t && t->defined())
      ATOM_CHECK(t->device() == dev, "{}: tensor {} is not on {}", op, t->str(), dev.str());
}

}  // namespace atom::kernels

#ifdef ATOM_HAVE_CUDA
#define ATOM_KERNEL_CUDA(op, call) call
#else
#define ATOM_KERNEL_CUDA(op, call) ::atom::fail("{}: this build of atom has no CUDA backend", op)
#endif
