#include "layers/context.h"

namespace atom {

KvCache KvCache::allocate(const std::vector<AttentionCacheSpec>& specs, int num_pages,
                          int block_size, Device device,
                          const std::vector<StateCacheSpec>& state_specs, int num_state_slots) {
  KvCache c;
  c.block_size = block_size;
  c.num_pages = num_pages;
  c.num_state_slots = num_state_slots;
  for (const auto& s : specs) {
    const Shape shape = {num_pages, block_size, s.num_kv_heads, s.head_dim};
    c.k.push_back(Tensor::zeros(shape, s.dtype, device));
    c.v.push_back(Tensor::zeros(shape, s.dtype, device));
  }
  for (const auto& s : state_specs) {
    Shape shape = {num_state_slots};
    shape.insert(shape.end(), s.shape.begin(), s.shape.end());
    c.state.push_back(Tensor::zeros(shape, s.dtype, device));
  }
  return c;
}

size_t KvCache::state_slot_bytes(const std::vector<StateCacheSpec>& specs) {
  size_t b = 0;
  for (const auto& s : specs) b += dtype_bytes(s.dtype, static_cast<uint64_t>(shape_numel(s.shape)));
  return b;
}

size_t KvCache::page_bytes(const std::vector<AttentionCacheSpec>& specs, int block_size) {
  size_t b = 0;
  for (const auto& s : specs)
    b += 2 * dtype_bytes(s.dtype, static_cast<uint64_t>(block_size) * s.num_kv_heads * s.head_dim);
  return b;
}

}  // namespace atom
