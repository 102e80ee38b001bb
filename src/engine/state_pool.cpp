#include "engine/state_pool.h"

#include <utility>

#include "core/error.h"

namespace atom {

StatePool::StatePool(int num_slots, int slots_per_request)
    : num_slots_(num_slots), slots_per_request_(slots_per_request) {
  ATOM_CHECK(num_slots >= 0 && slots_per_request >= 0 && (slots_per_request == 0 || num_slots > 0),
             "state pool: {} slots, {} per request", num_slots, slots_per_request);
  for (int s = num_slots - 1; s >= 0; --s) free_.push_back(s);
}

bool StatePool::allocate(Sequence& seq) {
  ATOM_CHECK(seq.state_slots.empty(), "sequence already holds {} state slots",
             seq.state_slots.size());
  if (!enabled()) return true;
  if (num_free() < slots_per_request_) return false;
  for (int i = 0; i < slots_per_request_; ++i) {
    seq.state_slots.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

int32_t StatePool::rollback_slot(const Sequence& seq, int row, int rows) {
  ATOM_CHECK(rows >= 1 && row >= 0 && row < rows, "rollback slot of row {} of {}", row, rows);
  ATOM_CHECK(static_cast<int>(seq.state_slots.size()) >= rows,
             "a verification of {} rows needs {} state slots, the sequence holds {}", rows, rows,
             seq.state_slots.size());
  return row + 1 < rows ? seq.state_slots[static_cast<size_t>(row + 1)] : -1;
}

void StatePool::commit_rows(Sequence& seq, int rows, int accepted) {
  ATOM_CHECK(accepted >= 1 && accepted <= rows && static_cast<int>(seq.state_slots.size()) >= rows,
             "commit of {} of {} rows with {} state slots", accepted, rows, seq.state_slots.size());
  if (accepted < rows)
    std::swap(seq.state_slots[0], seq.state_slots[static_cast<size_t>(accepted)]);
}

void StatePool::free(Sequence& seq) {
  for (auto it = seq.state_slots.rbegin(); it != seq.state_slots.rend(); ++it) free_.push_back(*it);
  seq.state_slots.clear();
}

}  // namespace atom
