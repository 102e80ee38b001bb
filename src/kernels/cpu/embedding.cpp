#include "kernels/embedding.h"

#include <cstring>

#include "kernels/cpu/access.h"

namespace atom::kernels::cpu {

void embedding(Tensor& out, const Tensor& ids, const Tensor& table, int64_t vocab_start) {
  check_rows("embedding", out, "out");
  ATOM_CHECK(table.dim() == 2 && table.is_contiguous() && ids.dtype() == DType::kI32 &&
                 out.size(0) == ids.numel() && out.size(1) == table.size(1),
             "embedding: out {} ids {} table {}", out.str(), ids.str(), table.str());
  const int64_t T = ids.numel(), H = table.size(1), rows = table.size(0);
  const int32_t* id = ids.ptr<int32_t>();
#pragma omp parallel for schedule(static) if (T * H > kParallelMin)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = static_cast<int64_t>(id[t]) - vocab_start;
    char* o = row_ptr(out, t);
    if (r < 0 || r >= rows) {
      for (int64_t h = 0; h < H; ++h) store(o, out.dtype(), h, 0.0f);
      continue;
    }
    for (int64_t h = 0; h < H; ++h)
      store(o, out.dtype(), h, load(table.data(), table.dtype(), r * H + h));
  }
}

}  // namespace atom::kernels::cpu
