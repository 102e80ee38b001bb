// From a scheduler step to the Batch the ModelRunner takes: flat token ids and positions, query
// starts, context lengths, slot mapping, the CSR page table, state slots and the logits rows, plus
// what each logits row is for. Vectors are cleared, not freed, so steady-state steps allocate
// nothing.
#pragma once

#include <vector>

#include "engine/scheduler.h"
#include "layers/batch.h"

namespace atom {

// What one logits row serves.
struct LogitsRow {
  Sequence* seq;
  int prompt_pos;  // >= 0: this row scores prompt token prompt_pos + 1 (prompt_logprobs);
                   // -1: the sequence samples its next token from it
  // Speculative decoding: of a sequence with d = seq->num_draft_tokens drafts, the rows 0..d of
  // the tokens before each draft and of the last draft (d: the bonus row); -1 otherwise.
  int draft_index = -1;
};

void batch_build(const SchedulerOutput& step, int block_size, Batch& batch,
                 std::vector<LogitsRow>& rows);

}  // namespace atom
