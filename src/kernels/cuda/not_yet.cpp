// CUDA entry points that have no kernel yet. Each fails naming the op, so `--device cuda` reports
// exactly what is missing instead of falling back to the CPU. Entries leave this file as their
// kernels land.
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"

namespace atom::kernels::cuda {

namespace {
[[noreturn]] void missing(const char* op) { fail("{}: no CUDA kernel yet", op); }
}  // namespace

void linear(Tensor&, const Tensor&, const Tensor&, const Tensor&) { missing("linear"); }
void rms_norm(Tensor&, const Tensor&, Tensor*, const Tensor&, float, RmsNormKind) { missing("rms_norm"); }
void rope(Tensor&, Tensor&, const Tensor&, const Tensor&, const RopeArgs&) { missing("rope"); }
void silu_mul(Tensor&, const Tensor&) { missing("silu_mul"); }
void embedding(Tensor&, const Tensor&, const Tensor&, int64_t) { missing("embedding"); }
void kv_cache_write(Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&) { missing("kv_cache_write"); }
void paged_attention(Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionBatch&,
                     const Tensor&, const AttentionArgs&) {
  missing("paged_attention");
}
void add(Tensor&, const Tensor&, const Tensor&) { missing("add"); }
void gather_rows(Tensor&, const Tensor&, const Tensor&) { missing("gather_rows"); }
void cast(Tensor&, const Tensor&) { missing("cast"); }
void add_bias(Tensor&, const Tensor&) { missing("add_bias"); }
void argmax(Tensor&, const Tensor&) { missing("argmax"); }

}  // namespace atom::kernels::cuda
