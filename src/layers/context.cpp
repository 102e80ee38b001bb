#include "layers/context.h"

namespace atom {

KvCache KvCache::allocate(const std::vector<AttentionCacheSpec>& specs, int num_pages,
                          int block_size, Device device) {
  KvCache c;
  c.block_size = block_size;
  c.num_pages = num_pages;
  for (const auto& s : specs) {
    const Shape shape = {num_pages, block_size, s.num_kv_heads, s.head_dim};
    c.k.push_back(Tensor::zeros(shape, s.dtype, device));
    c.v.push_back(Tensor::zeros(shape, s.dtype, device));
  }
  return c;
}

size_t KvCache::page_bytes(const std::vector<AttentionCacheSpec>& specs, int block_size) {
  size_t b = 0;
  for (const auto& s : specs)
    b += 2 * dtype_bytes(s.dtype, static_cast<uint64_t>(block_size) * s.num_kv_heads * s.head_dim);
  return b;
}

}  // namespace atom
