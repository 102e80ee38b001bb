#include "core/arena.h"

#include <algorithm>

namespace atom {

namespace {
constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

Arena::Arena(Device device, size_t initial_bytes) : device_(device) {
  blocks_.push_back({storage_alloc(align_up(std::max<size_t>(initial_bytes, kAlign)), device), 0});
}

Tensor Arena::alloc(Shape shape, DType dtype) {
  const size_t n = align_up(dtype_bytes(dtype, static_cast<uint64_t>(shape_numel(shape))));
  Block* b = &blocks_.back();
  if (b->used + n > b->storage->nbytes()) {
    blocks_.push_back({storage_alloc(std::max(n, b->storage->nbytes() * 2), device_), 0});
    b = &blocks_.back();
  }
  void* p = static_cast<char*>(b->storage->data()) + b->used;
  b->used += n;
  step_bytes_ += n;
  high_water_ = std::max(high_water_, step_bytes_);
  return Tensor::wrap(p, std::move(shape), dtype, device_, b->storage);
}

void Arena::reset() {
  if (blocks_.size() > 1) {
    const size_t need = align_up(high_water_ + high_water_ / 4);
    blocks_.clear();
    blocks_.push_back({storage_alloc(need, device_), 0});
    ++generation_;
  }
  blocks_.back().used = 0;
  step_bytes_ = 0;
}

size_t Arena::capacity() const {
  size_t c = 0;
  for (const auto& b : blocks_) c += b.storage->nbytes();
  return c;
}

}  // namespace atom
