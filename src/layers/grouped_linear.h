// Column-parallel projections whose checkpoint rows are grouped per head.
#pragma once

#include <vector>

#include "layers/linear.h"

namespace atom {

// A column-parallel projection whose checkpoint interleaves its outputs by group (per head):
// rows [groups, part_sizes[0] + part_sizes[1] + ...], each group holding a slice of every part
// (Qwen3-Next's q_proj: per head [query | gate]; in_proj_qkvz: per key head [q | k | v | z];
// in_proj_ba: [b | a]). It is stored part-major - part 0 of every group, then part 1, ... - so
// that each part is one contiguous column range of the output. Groups are split over ranks.
class GroupedColumnParallelLinear : public ColumnParallelLinear {
 public:
  GroupedColumnParallelLinear(LayerContext& ctx, const std::string& prefix, int64_t in,
                              int64_t groups, std::vector<int64_t> part_sizes, bool bias);
  // Column range of part i in this rank's output: [part_offset(i), + part_width(i)).
  int64_t part_offset(size_t i) const;
  int64_t part_width(size_t i) const { return groups_per_rank_ * parts_.at(i); }

 private:
  int64_t groups_per_rank_;
  std::vector<int64_t> parts_;
};

}  // namespace atom
