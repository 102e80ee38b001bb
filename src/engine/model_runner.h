// Runs one Batch through a model on its device: uploads the descriptor, runs forward and the LM
// head, and returns the logits on the host. Owns the KV cache and the per-step scratch arena.
#pragma once

#include "layers/batch.h"
#include "layers/context.h"
#include "models/model.h"

namespace atom {

class ModelRunner {
 public:
  // num_state_slots: size of the per-request state pool of the model's recurrent layers (0 for
  // pure attention models).
  ModelRunner(Model& model, int num_pages, int block_size, int num_state_slots = 0);

  // Logits [len(batch.logits_indices), vocab] F32 on the host.
  Tensor execute(Batch& batch);

  Model& model() { return model_; }
  KvCache& kv() { return kv_; }
  int block_size() const { return kv_.block_size; }
  int num_pages() const { return kv_.num_pages; }

 private:
  Model& model_;
  KvCache kv_;
  Arena arena_;
};

}  // namespace atom
