// The per-request state slot pool of recurrent layers (gated delta net, KDA, ...), as in ATOM's
// model-support guide: a sequence gets `slots_per_request` slot indices at admission - one
// committed state plus a rollback slot per speculated token - reachable as seq.state_slots, with
// seq.state_slot() the committed one. The pool's bytes are reserved before the paged KV cache is
// sized, so admission needs only a free index. Slot memory itself lives in the KvCache
// (KvCache::state), one tensor per recurrent layer.
//
// Rollback (speculative decoding): a verification step runs a sequence's last token and its d
// drafts as d + 1 rows. Its recurrent layers keep the state after row r < d in rollback slot
// state_slots[r + 1] (batch.state_rollback_slots) and end with the state after row d in the
// committed slot. When the target accepts a < d drafts, the state after row a is the sequence's:
// that slot and the committed one trade places (no copy), and the states of the rejected rows
// are overwritten by a later verification.
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

  // The slot that keeps the state after row `row` of a verification of `rows` rows (the
  // sequence's last token, then rows - 1 drafts): rollback slot row + 1, or -1 for the last row
  // (whose state the committed slot ends with). An error when the sequence holds too few slots.
  static int32_t rollback_slot(const Sequence& seq, int row, int rows);
  // After that verification, with `accepted` rows kept (1 + the accepted drafts): the state after
  // the last kept row becomes the committed one.
  static void commit_rows(Sequence& seq, int rows, int accepted);

 private:
  int num_slots_, slots_per_request_;
  std::vector<int32_t> free_;  // a stack: the most recently freed slot is reused first
};

}  // namespace atom
