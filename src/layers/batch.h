// The one batch descriptor: built on the host by the scheduler (or a simple runner), uploaded to
// the model's device in one copy, and passed explicitly down forward().
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/arena.h"
#include "core/tensor.h"

namespace atom {

// How many entries a batch field has.
enum class BatchExtent : int {
  kTokens,        // num_tokens
  kSeqs,          // num_seqs
  kSeqsPlus1,     // num_seqs + 1 (CSR offsets, prefix sums)
  kSeqsOrNone,    // num_seqs, or empty when no layer reads it
  kTokensOrNone,  // num_tokens, or empty when no layer reads it
  kFree,          // checked by validate() against the other fields (page_indices, logits_indices)
};

// The one list of a batch's I32 fields: X(name, extent). Each becomes the host vector
// Batch::name and the device view Batch::dev.name; validate's sizes, upload, host copies
// (tensor-parallel ranks, decode-graph padding) are all derived from it. page_indices stays last:
// upload reserves room past it for a CUDA graph's larger page table.
#define ATOM_BATCH_FIELDS(X)                                                                      \
  X(token_ids, BatchExtent::kTokens)       /* flattened tokens, sequence after sequence */        \
  X(positions, BatchExtent::kTokens)       /* RoPE positions */                                   \
  X(query_start, BatchExtent::kSeqsPlus1)  /* prefix sums of query lengths */                     \
  X(context_lens, BatchExtent::kSeqs)      /* tokens in the cache after this step */              \
  X(slot_mapping, BatchExtent::kTokens)    /* cache slot (page * block_size + offset), -1 none */ \
  X(page_indptr, BatchExtent::kSeqsPlus1)  /* CSR offsets into page_indices */                    \
  X(logits_indices, BatchExtent::kFree)    /* token rows whose logits are computed */             \
  X(state_slots, BatchExtent::kSeqsOrNone) /* per-request state slot (recurrent layers) */        \
  X(state_rollback_slots, BatchExtent::kTokensOrNone) /* per row: the slot that receives the      \
     recurrent state after this row, -1 none (speculative verification rows) */                   \
  X(page_indices, BatchExtent::kFree)                 /* physical page of each logical page */

// Rows of a step's token embeddings replaced by other values: a multimodal prompt's image
// features at its placeholder tokens (transformers' masked_scatter of inputs_embeds), which the
// token embedding layer writes over its lookup (VocabParallelEmbedding::forward). Runs of
// consecutive rows: rows [dst_row, dst_row + values.size(0)) of the step's tokens take `values`
// [n, hidden] (F32 on the CPU; a view of a request's image features).
struct InputEmbeds {
  struct Run {
    int64_t dst_row = 0;
    Tensor values;
  };
  std::vector<Run> runs;
};

// The runs of `e` that fall in rows [start, start + n), rebased to start there; null when none
// does (a step's slice, a chunk of a prompt).
std::shared_ptr<const InputEmbeds> input_embeds_window(const InputEmbeds& e, int64_t start,
                                                       int64_t n);

struct Batch {
#define ATOM_BATCH_HOST_FIELD(name, extent) std::vector<int32_t> name;
  ATOM_BATCH_FIELDS(ATOM_BATCH_HOST_FIELD)
#undef ATOM_BATCH_HOST_FIELD
  int block_size = 16;
  int max_query_len = 0;
  // Recurrent models' state slots copied (from, to) before the step's forward pass: prefix
  // checkpoints taken after the previous step, then checkpoints restored for admitted sequences.
  std::vector<std::pair<int32_t, int32_t>> state_copies;
  int max_context_len = 0;
  // Embedding rows replaced for this step (null: none).
  std::shared_ptr<const InputEmbeds> input_embeds;

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  int num_seqs() const { return static_cast<int>(context_lens.size()); }

  // Device side, valid after upload(): one I32 view per field.
  struct Views {
#define ATOM_BATCH_VIEW_FIELD(name, extent) Tensor name;
    ATOM_BATCH_FIELDS(ATOM_BATCH_VIEW_FIELD)
#undef ATOM_BATCH_VIEW_FIELD
  } dev;

  // Checks the descriptor is consistent (sizes, monotone offsets, bounds); throws on a bug.
  // With num_pages (and num_state_slots) of the cache it runs against, every page index, cache
  // slot and state slot must address that cache: a bad one would read or write out of bounds.
  void validate(int64_t num_pages = -1, int64_t num_state_slots = -1) const;
  // Packs every field into one buffer and copies it to `arena`'s device in one transfer.
  // page_capacity: room for that many page entries is reserved (only the used ones are copied),
  // so a replayed CUDA graph finds every field at the address it recorded for a larger table.
  void upload(Arena& arena, int64_t page_capacity = 0);
  std::vector<int32_t> upload_staging;  // host buffer of upload(), reused across steps
  // Every host field and block_size copied from `from` (each vector reuses its capacity); the
  // device views are left alone (each copy uploads its own).
  void copy_host_from(const Batch& from);
  // Sequences [first, last) as a batch of their own, host fields only: their token rows, pages
  // and logits rows, rebased (pipeline micro-batches). The logits rows must ascend, so that the
  // slices' logits in order are this batch's. state_copies stay with this batch (the runner makes
  // them once, before the first slice).
  Batch slice(int first, int last) const;
  // The sequences whose pages lie in [first_page, first_page + num_pages) (a data-parallel rank's
  // share of the engine's pages: every page of a sequence is in one share, else an Error) as a
  // batch of their own, host fields only: their token rows in order, their pages and cache slots
  // rebased to the share, the logits rows among their tokens. rows[i]: this batch's row of the
  // share's row i; scatter[t]: the share's row of this batch's row t, or the share's token count
  // where another share holds it. state_copies and input embeddings stay with this batch.
  Batch page_share(int first_page, int num_pages, std::vector<int32_t>& rows,
                   std::vector<int32_t>& scatter) const;
};

}  // namespace atom
