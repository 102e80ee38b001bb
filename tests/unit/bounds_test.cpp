// Internal bounds that bad input could otherwise get past: a batch's page indices, cache slots
// and state slots against the cache it runs on, and an error thrown inside an OpenMP parallel
// region (once std::terminate, now an Error the caller catches).
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "core/parallel.h"
#include "kernels/attention.h"
#include "layers/batch.h"

namespace atom::test {
namespace {

Batch one_sequence() {
  Batch c;  // one sequence of two new tokens over a context of 3, in page 1 of 2
  c.token_ids = {5, 6};
  c.positions = {1, 2};
  c.query_start = {0, 2};
  c.context_lens = {3};
  c.slot_mapping = {5, 6};
  c.page_indptr = {0, 1};
  c.page_indices = {1};
  c.logits_indices = {1};
  c.state_slots = {0};
  c.block_size = 4;
  return c;
}

TEST(BatchValidate, BoundsPagesSlotsAndStateSlots) {
  Batch c = one_sequence();
  c.validate(2, 1);
  c.page_indices = {2};
  EXPECT_ERROR_CONTAINS(c.validate(2, 1), "page index 2", "2 pages");
  c.page_indices = {-1};
  EXPECT_ERROR_CONTAINS(c.validate(2, 1), "page index -1");
  c = one_sequence();
  c.slot_mapping = {5, 8};
  EXPECT_ERROR_CONTAINS(c.validate(2, 1), "cache slot 8", "8 slots");
  c.slot_mapping = {-2, 6};
  EXPECT_ERROR_CONTAINS(c.validate(2, 1), "cache slot -2");
  c = one_sequence();
  c.state_slots = {1};
  EXPECT_ERROR_CONTAINS(c.validate(2, 1), "state slot 1", "1 slots");
  c.state_slots = {-1};  // no slot, in a model with recurrent state
  EXPECT_ERROR_CONTAINS(c.validate(2, 1), "state slot -1");
  c.validate(2, -1);    // no recurrent layers (no state pool): state slots are not read
  c.state_slots = {0};  // a pool of no slots is no pool to write into (GLM-5.3's benchmark)
  EXPECT_ERROR_CONTAINS(c.validate(2, 0), "state slot 0", "0 slots");
  c = one_sequence();
  c.slot_mapping = {-1, 6};  // -1: not cached
  c.validate(2, 1);
}

TEST(ParallelErrors, AnErrorInsideAParallelRegionIsRethrown) {
  // A slot past the cache inside kv_cache_write's parallel loop (big enough to run in parallel).
  const int64_t T = 256, width = 256;
  Tensor kc = Tensor::zeros({4, 16, 1, width}, DType::kF32),
         vc = Tensor::zeros({4, 16, 1, width}, DType::kF32);
  Tensor k = Tensor::zeros({T, width}, DType::kF32), v = Tensor::zeros({T, width}, DType::kF32);
  Tensor slots = Tensor::zeros({T}, DType::kI32);
  for (int64_t t = 0; t < T; ++t) slots.ptr<int32_t>()[t] = static_cast<int32_t>(t % 64);
  kernels::kv_cache_write(kc, vc, k, v, slots);
  slots.ptr<int32_t>()[200] = 64;
  EXPECT_ERROR_CONTAINS(kernels::kv_cache_write(kc, vc, k, v, slots), "slot 64 beyond 4 pages");
  // And the helper itself: the first error wins, the rest of the work is skipped.
  ParallelErrors errors;
  std::atomic<int> ran{0};
#pragma omp parallel for
  for (int i = 0; i < 1000; ++i)
    errors.guard([&] {
      ++ran;
      if (i == 10) fail("item {} is bad", i);
    });
  EXPECT_ERROR_CONTAINS(errors.rethrow(), "item 10 is bad");
  EXPECT_GE(ran.load(), 1);
}

}  // namespace
}  // namespace atom::test
