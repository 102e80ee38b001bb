#include "engine/model_runner.h"

namespace atom {

ModelRunner::ModelRunner(Model& model, int num_pages, int block_size, int num_state_slots)
    : model_(model),
      kv_(KvCache::allocate(model.cache_specs(), num_pages, block_size, model.device(),
                            model.state_specs(), num_state_slots)),
      arena_(model.device(), 8 << 20) {}

Tensor ModelRunner::execute(Batch& batch) {
  batch.block_size = kv_.block_size;
  batch.validate();
  arena_.reset();
  batch.upload(arena_);
  Step step{batch, arena_, &kv_};
  Tensor hidden = model_.forward(step);
  Tensor logits = model_.compute_logits(step, hidden);
  return logits.to(Device::cpu());
}

}  // namespace atom
