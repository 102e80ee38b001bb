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

}  // namespace
}  // namespace atom::test
