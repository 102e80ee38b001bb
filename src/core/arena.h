// Per-step scratch memory: a bump allocator reset after every forward step. The same sequence of
// allocations gets the same addresses every step, which CUDA graph replay relies on.
#pragma once

#include <memory>
#include <vector>

#include "core/tensor.h"

namespace atom {

class Arena {
 public:
  Arena(Device device, size_t initial_bytes = 1 << 20);

  Tensor alloc(Shape shape, DType dtype);

  // A position in the step's allocations. release(m) hands back everything allocated since
  // mark() returned m, so a model can reuse one layer's scratch for the next: tensors allocated
  // after m must be dead by then. Marks are released innermost first.
  struct Mark {
    size_t block = 0, used = 0, step_bytes = 0;
  };
  Mark mark() const;
  void release(const Mark& m);
  // Invalidates every tensor handed out since the last reset. When one step outgrew the current
  // block, the blocks are merged into one large enough for it.
  void reset();
  Device device() const { return device_; }
  size_t capacity() const;
  size_t high_water() const { return high_water_; }
  // Changes whenever reset() replaced the blocks: tensors (and CUDA graphs) holding addresses of
  // an earlier generation are stale.
  uint64_t generation() const { return generation_; }

 private:
  struct Block {
    std::shared_ptr<Storage> storage;
    size_t used = 0;
  };
  Device device_;
  std::vector<Block> blocks_;
  size_t current_ = 0;  // the block allocations come from; later ones are free
  size_t step_bytes_ = 0;
  size_t high_water_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace atom
