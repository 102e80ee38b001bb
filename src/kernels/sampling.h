#pragma once

#include "kernels/dispatch.h"

namespace atom::kernels {

// ids[r] = argmax over logits[r, :] (first index on ties).   ids [R] I32, logits [R, V] F32
namespace cpu {
void argmax(Tensor& ids, const Tensor& logits);
}
namespace cuda {
void argmax(Tensor& ids, const Tensor& logits);
}

inline void argmax(Tensor& ids, const Tensor& logits) {
  check_same_device("argmax", ids.device(), {&logits});
  if (ids.device().is_cpu()) return cpu::argmax(ids, logits);
  ATOM_KERNEL_CUDA("argmax", cuda::argmax(ids, logits));
}

}  // namespace atom::kernels
