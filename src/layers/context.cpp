#include "layers/context.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace atom {

PipelineStage pipeline_stage(int64_t num_layers, int rank, int size,
                             const std::vector<int>& partition) {
  if (size < 1 || rank < 0 || rank >= size)
    fail("pipeline-parallel rank {} of size {} is invalid", rank, size);
  // One stage is the whole model, whatever its layers (a model without layers too).
  if (size > 1 && num_layers < size)
    fail("--pipeline-parallel-size {} is more than the model's {} layers (num_hidden_layers)", size,
         num_layers);
  PipelineStage s;
  s.rank = rank;
  s.size = size;
  // num_layers / size each; the remainder one more each on stages size-2, size-3, ... (vLLM's
  // get_pp_indices: the last stage also runs the head).
  std::vector<int64_t> n(static_cast<size_t>(size), num_layers / size);
  for (int64_t i = 0; i < num_layers % size; ++i) ++n[static_cast<size_t>(size - 2 - i)];
  if (!partition.empty()) {
    int64_t sum = 0;
    bool positive = true;
    for (const int p : partition) {
      sum += p;
      positive = positive && p > 0;
    }
    if (static_cast<int>(partition.size()) != size || !positive || sum != num_layers)
      fail("the pipeline layer partition (VLLM_PP_LAYER_PARTITION) must be {} positive layer "
           "counts adding up to the model's {} layers, got {} counts adding up to {}",
           size, num_layers, partition.size(), sum);
    n.assign(partition.begin(), partition.end());
  }
  for (int i = 0; i < rank; ++i) s.first_layer += n[static_cast<size_t>(i)];
  s.end_layer = s.first_layer + n[static_cast<size_t>(rank)];
  return s;
}

const char* cache_kind_name(CacheKind k) {
  switch (k) {
    case CacheKind::kKeyValue:
      return "key/value";
    case CacheKind::kLatent:
      return "latent";
    case CacheKind::kIndexerKey:
      return "indexer key";
    case CacheKind::kRows:
      return "rows";
  }
  return "?";
}

int CacheSpec::rows_per_page(int block_size) const {
  if (kind != CacheKind::kRows) return block_size;
  ATOM_CHECK(tokens_per_row >= 1 && block_size >= 1 &&
                 (block_size % tokens_per_row == 0 || tokens_per_row % block_size == 0),
             "KV cache: a row every {} tokens does not fit pages of {} tokens (the block size "
             "must divide the compression ratio or be a multiple of it)",
             tokens_per_row, block_size);
  return std::max(1, block_size / tokens_per_row);
}

size_t CacheSpec::page_bytes(int block_size) const {
  return static_cast<size_t>(planes()) *
         dtype_bytes(dtype,
                     static_cast<uint64_t>(rows_per_page(block_size)) * num_heads * head_dim);
}

Tensor& KvCache::plane(size_t i, CacheKind kind, int p) {
  ATOM_CHECK(i < specs.size(), "KV cache: layer cache {} of {}", i, specs.size());
  ATOM_CHECK(specs[i].kind == kind && p >= 0 && p < specs[i].planes(),
             "KV cache: layer cache {} holds {}, not plane {} of {}", i,
             cache_kind_name(specs[i].kind), p, cache_kind_name(kind));
  return planes[i][static_cast<size_t>(p)];
}

KvCache KvCache::allocate(const std::vector<CacheSpec>& specs, int num_pages, int block_size,
                          Device device, const std::vector<StateCacheSpec>& state_specs,
                          int num_state_slots) {
  KvCache c;
  c.block_size = block_size;
  c.num_pages = num_pages;
  c.num_state_slots = num_state_slots;
  c.specs = specs;
  for (const auto& s : specs) {
    ATOM_CHECK(s.num_heads > 0 && s.head_dim > 0, "KV cache: {} cache of {} heads of {}",
               cache_kind_name(s.kind), s.num_heads, s.head_dim);
    const Shape shape = {num_pages, s.rows_per_page(block_size), s.num_heads, s.head_dim};
    std::vector<Tensor> planes;
    for (int p = 0; p < s.planes(); ++p) planes.push_back(Tensor::zeros(shape, s.dtype, device));
    c.planes.push_back(std::move(planes));
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
  for (const auto& s : specs)
    b += dtype_bytes(s.dtype, static_cast<uint64_t>(shape_numel(s.shape)));
  return b;
}

size_t KvCache::page_bytes(const std::vector<CacheSpec>& specs, int block_size) {
  size_t b = 0;
  for (const auto& s : specs) b += s.page_bytes(block_size);
  return b;
}

}  // namespace atom
