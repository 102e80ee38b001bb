#include "engine/batch_builder.h"

#include "core/error.h"
#include "engine/multimodal.h"
#include "engine/state_pool.h"

namespace atom {

void batch_build(const SchedulerOutput& step, int block_size, Batch& b,
                 std::vector<LogitsRow>& rows) {
  b.token_ids.clear();
  b.positions.clear();
  b.query_start.clear();
  b.context_lens.clear();
  b.slot_mapping.clear();
  b.page_indptr.clear();
  b.page_indices.clear();
  b.logits_indices.clear();
  b.state_slots.clear();
  b.state_rollback_slots.clear();
  b.state_copies = step.state_copies;
  b.input_embeds.reset();
  std::shared_ptr<InputEmbeds> embeds;
  rows.clear();
  b.block_size = block_size;
  b.query_start.push_back(0);
  b.page_indptr.push_back(0);
  for (const ScheduledSeq& s : step.seqs) {
    Sequence& seq = *s.seq;
    const int start = seq.num_computed_tokens, end = start + s.num_new_tokens;
    ATOM_CHECK(
        end <= seq.num_tokens() && static_cast<int64_t>(seq.block_table.size()) * block_size >= end,
        "batch: sequence computes [{}, {}) of {} tokens with {} blocks", start, end,
        seq.num_tokens(), seq.block_table.size());
    const int row0 = b.num_tokens();
    const int P = seq.num_prompt_tokens;
    const Request& req = *seq.request;
    for (int pos = start; pos < end; ++pos) {
      b.token_ids.push_back(seq.tokens[static_cast<size_t>(pos)]);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(seq.block_table[static_cast<size_t>(pos / block_size)] * block_size +
                               pos % block_size);
      // A prompt row's logits score the next prompt token; rows collected before a preemption
      // are not collected again.
      if (seq.collects_prompt_logprobs && pos + 1 < P && pos + 1 >= req.prompt_logprobs_done) {
        b.logits_indices.push_back(row0 + pos - start);
        rows.push_back({&seq, pos});
      }
    }
    if (req.images) prompt_images_embeds(*req.images, start, end, row0, embeds);
    b.query_start.push_back(b.num_tokens());
    b.context_lens.push_back(end);
    const int pages = (end + block_size - 1) / block_size;
    b.page_indices.insert(b.page_indices.end(), seq.block_table.begin(),
                          seq.block_table.begin() + pages);
    b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
    b.state_slots.push_back(seq.state_slot());
    // Speculative verification of a recurrent model: the state after each row but the last is
    // kept in the sequence's rollback slots (StatePool::rollback_slot), every other row -1.
    if (seq.num_draft_tokens > 0 && !seq.state_slots.empty()) {
      const int rows = s.num_new_tokens;
      ATOM_CHECK(rows == seq.num_draft_tokens + 1, "batch: {} rows verify {} draft tokens", rows,
                 seq.num_draft_tokens);
      b.state_rollback_slots.resize(static_cast<size_t>(row0), -1);
      for (int r = 0; r < rows; ++r)
        b.state_rollback_slots.push_back(StatePool::rollback_slot(seq, r, rows));
    }
    // The last known token is computed: its logits give the next token. With draft tokens at
    // the end, the rows before each of them verify it.
    if (end == seq.num_tokens() && seq.num_output_tokens() < seq.params().max_tokens) {
      const int d = seq.num_draft_tokens;
      ATOM_CHECK(d < s.num_new_tokens, "batch: {} draft tokens in a step of {}", d,
                 s.num_new_tokens);
      for (int i = 0; i <= d; ++i) {
        b.logits_indices.push_back(b.num_tokens() - 1 - d + i);
        rows.push_back({&seq, -1, d > 0 ? i : -1});
      }
    }
  }
  if (!b.state_rollback_slots.empty())
    b.state_rollback_slots.resize(static_cast<size_t>(b.num_tokens()), -1);
  b.input_embeds = std::move(embeds);
}

}  // namespace atom
