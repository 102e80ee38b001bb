// The ranks' threads: every job runs once per rank at the same time, ranks agree on a number,
// errors come back to the caller, and a rank that fails does not leave the others waiting in a
// collective forever (the failure hook aborts their group).
#include "dist/rank_threads.h"

#include <gtest/gtest.h>

#include <atomic>

#include "common/test_util.h"
#include "dist/comm_group.h"

namespace atom::test {
namespace {

TEST(RankThreads, RunsEveryRankTogetherAndAgreesOnTheSmallest) {
  RankThreads t(std::vector<Device>(3, Device::cpu()));
  EXPECT_EQ(t.size(), 3);
  for (int round = 0; round < 20; ++round) {
    std::vector<int> seen(3, -1), agreed(3, -1);
    t.run([&](int r) {
      seen[static_cast<size_t>(r)] = r;
      // Needs all three at once: a rank run alone would wait here forever.
      agreed[static_cast<size_t>(r)] = t.min_over_ranks(10 * (r + 1) + round);
      EXPECT_EQ(t.min_over_ranks(-r), -2);
    });
    EXPECT_EQ(seen, (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(agreed, std::vector<int>(3, 10 + round));
  }
}

TEST(RankThreads, AFailedRankNeitherHangsTheOthersNorTheThreads) {
  auto group = comm_group_create(Device::cpu(), 2);
  RankThreads t(std::vector<Device>(2, Device::cpu()));
  t.set_failure_hook([&] { group->abort(); });
  // Rank 1 fails before a collective that rank 0 is already waiting in.
  EXPECT_ERROR_CONTAINS(t.run([&](int r) {
    if (r == 1) fail("rank 1 is out of memory");
    Tensor x = Tensor::zeros({4}, DType::kF32);
    group->communicator(r).all_reduce_sum(x);
  }),
                        "rank 1 is out of memory");
  // An agreement is not left waiting either.
  EXPECT_ERROR_CONTAINS(t.run([&](int r) {
    if (r == 0) fail("rank 0 failed");
    t.min_over_ranks(1);
  }),
                        "rank 0 failed");
  // The threads still run jobs afterwards.
  std::atomic<int> ran{0};
  t.run([&](int) { ++ran; });
  EXPECT_EQ(ran.load(), 2);
}

}  // namespace
}  // namespace atom::test
