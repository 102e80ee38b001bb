#include "kernels/sampling.h"

#include "kernels/cpu/access.h"

namespace atom::kernels::cpu {

void argmax(Tensor& ids, const Tensor& logits) {
  check_rows("argmax", logits, "logits");
  ATOM_CHECK(ids.numel() == logits.size(0) && ids.dtype() == DType::kI32, "argmax: ids {} logits {}",
             ids.str(), logits.str());
  const int64_t V = logits.size(1);
  for (int64_t r = 0; r < logits.size(0); ++r) {
    const char* p = row_ptr(logits, r);
    int64_t best = 0;
    float bv = load(p, logits.dtype(), 0);
    for (int64_t v = 1; v < V; ++v) {
      const float x = load(p, logits.dtype(), v);
      if (x > bv) {
        bv = x;
        best = v;
      }
    }
    ids.ptr<int32_t>()[r] = static_cast<int32_t>(best);
  }
}

}  // namespace atom::kernels::cpu
