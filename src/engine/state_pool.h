// The per-request state slot pool of recurrent layers (gated delta net, KDA, ...), as in ATOM's
// model-support guide: a sequence gets `slots_per_request` slot indices at admission - one
// committed state plus a rollback slot per speculated token - reachable as seq.state_slots, with
// seq.state_slot() the committed one. The pool's bytes are reserved before the paged KV cache is
// sized, so admission needs only a free index. Slot memory itself lives in the KvCache
// (KvCache::state), one tensor per recurrent layer.
#pragma once

#include <vector>

#include "engine/sequence.h"

namespace atom {

class StatePool {
 public:
  // slots_per_request 0: the model keeps no recurrent state and the pool is inert.
  StatePool(int num_slots, int slots_per_request);

  bool enabled() const { return slots_per_request_ > 0; }
  int num_slots() const { return num_slots_; }
  int slots_per_request() const { return slots_per_request_; }
  int num_free() const { return static_cast<int>(free_.size()); }
  bool can_allocate() const { return !enabled() || num_free() >= slots_per_request_; }

  // Gives seq its slots (no-op when disabled); false when the pool is exhausted.
  bool allocate(Sequence& seq);
  void free(Sequence& seq);

 private:
  int num_slots_, slots_per_request_;
  std::vector<int32_t> free_;  // a stack: the most recently freed slot is reused first
};

}  // namespace atom
