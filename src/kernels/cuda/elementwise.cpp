// CUDA entry points of the element-wise ops (kernels in elementwise.cu).
#include "kernels/elementwise.h"

#include "kernels/activation.h"
#include "kernels/cuda/host_common.h"
#include "kernels/cuda/launch_moe_quant.h"
#include "kernels/embedding.h"
#include "kernels/random.h"

namespace atom::kernels::cuda {

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  check_rows("add", out, "out");
  check_rows("add", a, "a");
  check_rows("add", b, "b");
  ATOM_CHECK(a.shape() == b.shape() && out.shape() == a.shape(), "add: {} + {} -> {}", a.str(),
             b.str(), out.str());
  launch_add(mat_of(out, "add"), mat_of(a, "add"), mat_of(b, "add"), current_stream());
  launch_check("add");
}

void add_gated(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& gate) {
  check_rows("add_gated", out, "out");
  check_rows("add_gated", a, "a");
  check_rows("add_gated", b, "b");
  check_rows("add_gated", gate, "gate");
  ATOM_CHECK(a.shape() == b.shape() && out.shape() == a.shape() && gate.size(0) == a.size(0) &&
                 gate.size(1) == 1,
             "add_gated: {} + sigmoid({}) * {} -> {}", a.str(), gate.str(), b.str(), out.str());
  launch_add_gated(mat_of(out, "add_gated"), mat_of(a, "add_gated"), mat_of(b, "add_gated"),
                   mat_of(gate, "add_gated"), current_stream());
  launch_check("add_gated");
}

void gather_rows(Tensor& out, const Tensor& x, const Tensor& indices) {
  check_rows("gather_rows", out, "out");
  check_rows("gather_rows", x, "x");
  ATOM_CHECK(out.size(0) == indices.numel() && out.size(1) == x.size(1) &&
                 out.dtype() == x.dtype() && is_i32(indices),
             "gather_rows: x {} indices {} out {}", x.str(), indices.str(), out.str());
  launch_gather_rows(mat_of(out, "gather_rows"), mat_of(x, "gather_rows"), indices.ptr<int32_t>(),
                     current_stream());
  launch_check("gather_rows");
}

void cast(Tensor& out, const Tensor& x) {
  check_rows("cast", out, "out");
  check_rows("cast", x, "x");
  ATOM_CHECK(out.shape() == x.shape(), "cast: {} -> {}", x.str(), out.str());
  launch_cast(mat_of(out, "cast"), mat_of(x, "cast"), current_stream());
  launch_check("cast");
}

void add_bias(Tensor& out, const Tensor& bias) {
  check_rows("add_bias", out, "out");
  ATOM_CHECK(bias.numel() == out.size(1) && bias.is_contiguous(), "add_bias: {} + {}", out.str(),
             bias.str());
  launch_add_bias(mat_of(out, "add_bias"), bias.data(), elem_of(bias.dtype(), "add_bias"),
                  current_stream());
  launch_check("add_bias");
}

void embedding(Tensor& out, const Tensor& ids, const Tensor& table, int64_t vocab_start) {
  check_rows("embedding", out, "out");
  ATOM_CHECK(table.dim() == 2 && table.is_contiguous() && is_i32(ids) &&
                 out.size(0) == ids.numel() && out.size(1) == table.size(1),
             "embedding: out {} ids {} table {}", out.str(), ids.str(), table.str());
  launch_embedding(mat_of(out, "embedding"), ids.ptr<int32_t>(), table.data(),
                   elem_of(table.dtype(), "embedding"), table.size(0), vocab_start,
                   current_stream());
  launch_check("embedding");
}

void glu(Tensor& out, const Tensor& x, const Glu& a) {
  check_rows("glu", out, "out");
  check_rows("glu", x, "x");
  const int64_t M = x.size(0), I = out.size(1);
  ATOM_CHECK(out.size(0) == M && x.size(1) == 2 * I && out.dtype() == x.dtype(), "glu: x {} out {}",
             x.str(), out.str());
  const GluConstants c = glu_constants(a);
  launch_glu(mat_of(out, "glu"), mat_of(x, "glu"), c.act, c.alpha, c.limit, current_stream());
  launch_check("glu");
}

void fill_uniform_bytes(Tensor& t, uint64_t seed, int lo, int hi) {
  launch_fill_bytes(static_cast<uint8_t*>(t.data()), t.numel(), seed, lo, hi, current_stream());
  launch_check("fill_uniform_bytes");
}

void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi) {
  ATOM_CHECK(t.is_contiguous(), "fill_uniform: {} must be contiguous", t.str());
  if (t.dtype() == DType::kF8E4M3)
    launch_fill_uniform_f8(static_cast<uint8_t*>(t.data()), t.numel(), seed, lo, hi,
                           current_stream());
  else
    launch_fill_uniform(t.data(), elem_of(t.dtype(), "fill_uniform"), t.numel(), seed, lo, hi,
                        current_stream());
  launch_check("fill_uniform");
}

}  // namespace atom::kernels::cuda
