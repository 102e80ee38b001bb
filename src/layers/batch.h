// The one batch descriptor: built on the host by the scheduler (or a simple runner), uploaded to
// the model's device in one copy, and passed explicitly down forward().
#pragma once

#include <cstdint>
#include <vector>

#include "core/arena.h"
#include "core/tensor.h"

namespace atom {

struct Batch {
  // Host side. Tokens of all sequences are flattened, sequence after sequence.
  std::vector<int32_t> token_ids;       // [num_tokens]
  std::vector<int32_t> positions;       // [num_tokens] RoPE positions
  std::vector<int32_t> query_start;     // [num_seqs + 1] prefix sums of query lengths
  std::vector<int32_t> context_lens;    // [num_seqs] tokens in the cache after this step
  std::vector<int32_t> slot_mapping;    // [num_tokens] cache slot (page * block_size + offset)
  std::vector<int32_t> page_indptr;     // [num_seqs + 1] CSR offsets into page_indices
  std::vector<int32_t> page_indices;    // [total pages] physical page of each logical page
  std::vector<int32_t> logits_indices;  // [num_logits] token rows whose logits are computed
  std::vector<int32_t> state_slots;     // [num_seqs] per-request state slot (recurrent layers)
  int block_size = 16;
  int max_query_len = 0;
  int max_context_len = 0;

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  int num_seqs() const { return static_cast<int>(context_lens.size()); }

  // Device side, valid after upload().
  struct Views {
    Tensor token_ids, positions, query_start, context_lens, slot_mapping, page_indptr, page_indices,
        logits_indices, state_slots;  // I32
  } dev;

  // Checks the descriptor is consistent (sizes, monotone offsets, bounds); throws on a bug.
  void validate() const;
  // Packs every field into one buffer and copies it to `arena`'s device in one transfer.
  // page_capacity: room for that many page entries is reserved (only the used ones are copied),
  // so a replayed CUDA graph finds every field at the address it recorded for a larger table.
  void upload(Arena& arena, int64_t page_capacity = 0);
  std::vector<int32_t> upload_staging;  // host buffer of upload(), reused across steps
};

}  // namespace atom
