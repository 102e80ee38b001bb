#include "core/arena.h"

#include <algorithm>

#include "core/error.h"

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
  // Blocks after the current one exist when a release went back past them: reuse them in order.
  while (current_ + 1 < blocks_.size() &&
         blocks_[current_].used + n > blocks_[current_].storage->nbytes())
    blocks_[++current_].used = 0;
  Block* b = &blocks_[current_];
  if (b->used + n > b->storage->nbytes()) {
    blocks_.push_back({storage_alloc(std::max(n, b->storage->nbytes() * 2), device_), 0});
    current_ = blocks_.size() - 1;
    b = &blocks_.back();
  }
  void* p = static_cast<char*>(b->storage->data()) + b->used;
  b->used += n;
  step_bytes_ += n;
  high_water_ = std::max(high_water_, step_bytes_);
  return Tensor::wrap(p, std::move(shape), dtype, device_, b->storage);
}

Arena::Mark Arena::mark() const { return {current_, blocks_[current_].used, step_bytes_}; }

void Arena::release(const Mark& m) {
  ATOM_CHECK(m.block < blocks_.size() && m.step_bytes <= step_bytes_ &&
                 (m.block < current_ || (m.block == current_ && m.used <= blocks_[current_].used)),
             "arena: release of a mark taken after a later release or reset");
  current_ = m.block;
  blocks_[current_].used = m.used;
  step_bytes_ = m.step_bytes;
}

void Arena::reset() {
  if (blocks_.size() > 1) {
    const size_t need = align_up(high_water_ + high_water_ / 4);
    blocks_.clear();
    blocks_.push_back({storage_alloc(need, device_), 0});
    ++generation_;
  }
  for (auto& b : blocks_) b.used = 0;
  current_ = 0;
  step_bytes_ = 0;
}

size_t Arena::capacity() const {
  size_t c = 0;
  for (const auto& b : blocks_) c += b.storage->nbytes();
  return c;
}

}  // namespace atom
