#include "layers/grouped_linear.h"

#include "core/error.h"

namespace atom {

namespace {
void check_divisible(const std::string& prefix, const char* what, int64_t n, int tp) {
  if (n % tp != 0)
    fail("{}: {} ({}) is not divisible by the tensor-parallel size {}", prefix, what, n, tp);
}
}  // namespace

GroupedColumnParallelLinear::GroupedColumnParallelLinear(LayerContext& ctx,
                                                         const std::string& prefix, int64_t in,
                                                         int64_t groups,
                                                         std::vector<int64_t> part_sizes, bool bias)
    : ColumnParallelLinear(ctx, in, 0), parts_(std::move(part_sizes)) {
  check_divisible(prefix, "number of groups", groups, ctx.tp_size);
  groups_per_rank_ = groups / ctx.tp_size;
  int64_t width = 0;
  for (const int64_t p : parts_) width += p;
  out_ = groups_per_rank_ * width;
  const int64_t G = groups_per_rank_, first = ctx.tp_rank * G, total_rows = groups * width;
  // Part-major: part n of every group of this rank, then part n + 1, ...
  LinearLayout l;
  int64_t dst = 0, src_in_group = 0;
  for (const int64_t n : parts_) {
    for (int64_t g = 0; g < G; ++g, dst += n)
      l.parts.push_back({"", "", (first + g) * width + src_in_group, dst, n, total_rows});
    src_in_group += n;
  }
  l.cols = l.ckpt_cols = in;
  init_params(prefix, std::move(l), bias);
}

int64_t GroupedColumnParallelLinear::part_offset(size_t i) const {
  int64_t off = 0;
  for (size_t j = 0; j < i; ++j) off += part_width(j);
  return off;
}

}  // namespace atom
