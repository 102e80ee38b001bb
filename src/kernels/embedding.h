#pragma once

#include "kernels/dispatch.h"

namespace atom::kernels {

// out[t] = table[ids[t] - vocab_start] when that row is in this shard, else zeros.
//   out [T, H]    ids [T] I32    table [rows, H]
namespace cpu {
void embedding(Tensor& out, const Tensor& ids, const Tensor& table, int64_t vocab_start);
}
namespace cuda {
void embedding(Tensor& out, const Tensor& ids, const Tensor& table, int64_t vocab_start);
}

inline void embedding(Tensor& out, const Tensor& ids, const Tensor& table, int64_t vocab_start) {
  check_same_device("embedding", out.device(), {&ids, &table});
  if (out.device().is_cpu()) return cpu::embedding(out, ids, table, vocab_start);
  ATOM_KERNEL_CUDA("embedding", cuda::embedding(out, ids, table, vocab_start));
}

}  // namespace atom::kernels
