// Pipeline micro-batches (engine/model_runner.h): where a step's sequences are cut, and
// Batch::slice, which must give each slice exactly its sequences' rows, pages and logits rows.
// The engine over pipeline stages with micro-batches against one rank: tests/engine/engine_tp_test.
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "engine/model_runner.h"

namespace atom::test {
namespace {

// Four sequences: a prefill of 5 tokens (logits at its last), two decodes, a verification of 3
// rows (logits at each), pages of 4 tokens, recurrent state slots and rollback rows.
Batch four_sequences() {
  Batch b;
  b.block_size = 4;
  const std::vector<int> q = {5, 1, 1, 3}, ctx = {5, 9, 2, 7};
  b.query_start = {0};
  b.page_indptr = {0};
  int32_t page = 10;
  for (size_t s = 0; s < q.size(); ++s) {
    for (int i = 0; i < q[s]; ++i) {
      const int pos = ctx[s] - q[s] + i;
      b.token_ids.push_back(static_cast<int32_t>(100 * s + i));
      b.positions.push_back(pos);
      b.slot_mapping.push_back(page * 4 + pos % 4);
      b.state_rollback_slots.push_back(s == 3 ? static_cast<int32_t>(20 + i) : -1);
    }
    b.query_start.push_back(b.query_start.back() + q[s]);
    b.context_lens.push_back(ctx[s]);
    for (int p = 0; p < (ctx[s] + 3) / 4; ++p) b.page_indices.push_back(page++);
    b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
    b.state_slots.push_back(static_cast<int32_t>(s));
  }
  b.logits_indices = {4, 5, 6, 7, 8, 9};
  b.state_copies = {{7, 8}};
  b.validate();
  return b;
}

TEST(MicroBatch, SliceKeepsEachSequencesRowsPagesAndLogits) {
  const Batch b = four_sequences();
  const Batch mid = b.slice(1, 3);  // the two decodes
  mid.validate();
  EXPECT_EQ(mid.token_ids, (std::vector<int32_t>{100, 200}));
  EXPECT_EQ(mid.positions, (std::vector<int32_t>{8, 1}));
  EXPECT_EQ(mid.query_start, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(mid.context_lens, (std::vector<int32_t>{9, 2}));
  EXPECT_EQ(mid.page_indptr, (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(mid.page_indices, (std::vector<int32_t>{12, 13, 14, 15}));
  EXPECT_EQ(mid.slot_mapping, (std::vector<int32_t>{b.slot_mapping[5], b.slot_mapping[6]}));
  EXPECT_EQ(mid.state_slots, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(mid.state_rollback_slots, (std::vector<int32_t>{-1, -1}));
  EXPECT_EQ(mid.logits_indices, (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(mid.state_copies.empty());
  const Batch last = b.slice(3, 4);  // the verification rows
  last.validate();
  EXPECT_EQ(last.logits_indices, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(last.state_rollback_slots, (std::vector<int32_t>{20, 21, 22}));
  EXPECT_EQ(last.page_indices, (std::vector<int32_t>{16, 17}));
  const Batch first = b.slice(0, 1);
  EXPECT_EQ(first.logits_indices, (std::vector<int32_t>{4}));
  EXPECT_TRUE(first.state_copies.empty());  // made once by the runner, before the slices
  // The slices' logits rows, in order, are the batch's.
  size_t rows = 0;
  for (const auto& [a, z] : {std::pair{0, 1}, std::pair{1, 3}, std::pair{3, 4}})
    rows += b.slice(a, z).logits_indices.size();
  EXPECT_EQ(rows, b.logits_indices.size());
  EXPECT_ERROR_CONTAINS(b.slice(2, 2), "slice [2, 2) of 4 sequences");
  Batch unsorted = b;
  unsorted.logits_indices = {9, 4};
  EXPECT_ERROR_CONTAINS(unsorted.slice(0, 2), "do not ascend");
}

TEST(MicroBatch, CutsBalanceTokensWithAtLeastOneSequenceEach) {
  const Batch b = four_sequences();  // tokens 5, 1, 1, 3
  EXPECT_EQ(micro_batch_cuts(b, 1), (std::vector<int>{0, 4}));
  EXPECT_EQ(micro_batch_cuts(b, 2), (std::vector<int>{0, 1, 4}));     // 5 | 5
  EXPECT_EQ(micro_batch_cuts(b, 3), (std::vector<int>{0, 1, 3, 4}));  // 5 | 2 | 3
  EXPECT_EQ(micro_batch_cuts(b, 4), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(micro_batch_cuts(b, 9), (std::vector<int>{0, 1, 2, 3, 4}));  // one sequence each
  Batch unsorted = b;
  unsorted.logits_indices = {9, 4};
  EXPECT_EQ(micro_batch_cuts(unsorted, 2), (std::vector<int>{0, 4}));
}

// Data-parallel attention's share of a step: the sequences on pages [first, first + n), rebased.
TEST(DataParallelShare, PageShareKeepsItsSequencesRowsAndRebasesPages) {
  const Batch b = four_sequences();  // pages: 10-11 | 12-14 | 15 | 16-17
  std::vector<int32_t> rows, scatter;
  const Batch s = b.page_share(12, 4, rows, scatter);  // sequences 1 and 2
  s.validate(4);
  EXPECT_EQ(rows, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(scatter, (std::vector<int32_t>{2, 2, 2, 2, 2, 0, 1, 2, 2, 2}));
  EXPECT_EQ(s.token_ids, (std::vector<int32_t>{100, 200}));
  EXPECT_EQ(s.positions, (std::vector<int32_t>{8, 1}));
  EXPECT_EQ(s.query_start, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(s.context_lens, (std::vector<int32_t>{9, 2}));
  EXPECT_EQ(s.page_indptr, (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(s.page_indices, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(s.slot_mapping, (std::vector<int32_t>{b.slot_mapping[5] - 48, b.slot_mapping[6] - 48}));
  EXPECT_EQ(s.state_slots, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(s.logits_indices, (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(s.state_copies.empty());
  // A share nobody's pages are in: no rows, every row another's.
  const Batch none = b.page_share(40, 8, rows, scatter);
  EXPECT_EQ(none.num_seqs(), 0);
  EXPECT_TRUE(rows.empty());
  EXPECT_EQ(scatter, std::vector<int32_t>(10, 0));
  // The first and last sequences together: rows out of order with the others between.
  Batch ends = b;
  ends.page_indices = {0, 1, 12, 13, 14, 15, 2, 3};
  for (int t = 0; t < ends.num_tokens(); ++t) {
    const int seq = t < 5 ? 0 : t < 6 ? 1 : t < 7 ? 2 : 3;
    const int pos = ends.positions[static_cast<size_t>(t)];
    const int first = ends.page_indptr[static_cast<size_t>(seq)];
    ends.slot_mapping[static_cast<size_t>(t)] =
        ends.page_indices[static_cast<size_t>(first + pos / 4)] * 4 + pos % 4;
  }
  const Batch e = ends.page_share(0, 4, rows, scatter);
  EXPECT_EQ(rows, (std::vector<int32_t>{0, 1, 2, 3, 4, 7, 8, 9}));
  EXPECT_EQ(e.logits_indices, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(e.page_indices, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(e.state_rollback_slots, (std::vector<int32_t>{-1, -1, -1, -1, -1, 20, 21, 22}));
  // A sequence with pages in two shares is a bug the runner must not paper over.
  EXPECT_ERROR_CONTAINS(b.page_share(11, 4, rows, scatter),
                        "holds pages inside and outside the share [11, 15)");
}

}  // namespace
}  // namespace atom::test
