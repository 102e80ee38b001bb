// What layers are built with (LayerContext) and what a forward step hands them (Step).
#pragma once

#include <string>
#include <vector>

#include "core/arena.h"
#include "dist/communicator.h"
#include "layers/batch.h"
#include "loader/parameter.h"

namespace atom {

// One paged attention cache a layer needs: the runner allocates
// [num_pages, block_size, num_kv_heads, head_dim] for K and for V.
struct AttentionCacheSpec {
  int num_kv_heads = 0;  // on this rank
  int head_dim = 0;
  DType dtype = DType::kF32;
  int sliding_window = 0;  // 0: full attention
};

// One per-request state a recurrent layer keeps (gated delta net, KDA, a test layer): the cache
// holds num_state_slots copies of it, and batch.state_slots says which slot each sequence uses.
// A layer treats a sequence whose step starts at context index 0 as new and resets its slot.
struct StateCacheSpec {
  Shape shape;  // of one slot, e.g. [heads, k_dim, v_dim]
  DType dtype = DType::kF32;
};

// Every cache kind a model needs, side by side: paged K/V per attention layer and a state slot
// pool per recurrent layer.
struct KvCache {
  int block_size = 16;
  int num_pages = 0;
  int num_state_slots = 0;
  std::vector<Tensor> k, v;   // one per AttentionCacheSpec, [num_pages, block_size, Hk, D]
  std::vector<Tensor> state;  // one per StateCacheSpec, [num_state_slots, *spec.shape]

  static KvCache allocate(const std::vector<AttentionCacheSpec>& specs, int num_pages,
                          int block_size, Device device,
                          const std::vector<StateCacheSpec>& state_specs = {},
                          int num_state_slots = 0);
  // Bytes one page takes over all layers.
  static size_t page_bytes(const std::vector<AttentionCacheSpec>& specs, int block_size);
  // Bytes one state slot takes over all recurrent layers.
  static size_t state_slot_bytes(const std::vector<StateCacheSpec>& specs);
};

// `specs` with every attention cache stored as `dtype` (the KV cache dtype the runner is given).
inline std::vector<AttentionCacheSpec> cache_specs_with_dtype(std::vector<AttentionCacheSpec> specs,
                                                              DType dtype) {
  for (auto& s : specs) s.dtype = dtype;
  return specs;
}

struct LayerContext {
  ParamRegistry& params;
  Device device;
  DType weight_dtype;  // storage of dense weights
  DType act_dtype;     // activations (F32 on the CPU reference, BF16 on CUDA)
  int tp_rank = 0;
  int tp_size = 1;
  Communicator* comm = nullptr;  // never null once a model is built
  std::vector<AttentionCacheSpec>* cache_specs = nullptr;
  std::vector<StateCacheSpec>* state_specs = nullptr;  // recurrent layers add theirs here
  // Shared experts load as slots of their layer's fused experts (ModelOptions).
  bool fuse_shared_experts = false;

  // A zero-initialised parameter tensor on the model's device.
  Tensor param_tensor(Shape shape, DType dtype) const {
    return Tensor::zeros(std::move(shape), dtype, device);
  }
};

// One forward step.
struct Step {
  Batch& batch;
  Arena& arena;
  KvCache* kv = nullptr;

  Tensor empty(Shape shape, DType dtype) { return arena.alloc(std::move(shape), dtype); }
};

// "a" + "." + "b", or "b" when a is empty.
inline std::string prefix_join(const std::string& a, const std::string& b) {
  return a.empty() ? b : a + "." + b;
}

}  // namespace atom
