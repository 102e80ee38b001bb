#include "core/arena.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace atom {

namespace {
const char* addr(const Tensor& t) { return static_cast<const char*>(t.data()); }
}  // namespace

TEST(Arena, SameAllocationsGetTheSameAddressesAfterReset) {
  Arena a(Device::cpu(), 4096);
  Tensor x = a.alloc({100}, DType::kF32);
  Tensor y = a.alloc({7}, DType::kBF16);
  EXPECT_EQ(addr(y) - addr(x), 512);  // 400 bytes, aligned to 256
  const void *px = x.data(), *py = y.data();
  a.reset();
  EXPECT_EQ(a.alloc({100}, DType::kF32).data(), px);
  EXPECT_EQ(a.alloc({7}, DType::kBF16).data(), py);
}

TEST(Arena, GrowsThenMergesIntoOneBlockAtReset) {
  Arena a(Device::cpu(), 1024);
  for (int i = 0; i < 10; ++i) a.alloc({256}, DType::kF32);  // 10 KiB through a 1 KiB block
  EXPECT_EQ(a.high_water(), 10u * 1024);
  const uint64_t gen = a.generation();
  a.reset();
  EXPECT_NE(a.generation(), gen);
  EXPECT_GE(a.capacity(), 10u * 1024);
  const char* first = addr(a.alloc({256}, DType::kF32));
  for (int i = 1; i < 10; ++i) EXPECT_EQ(addr(a.alloc({256}, DType::kF32)), first + i * 1024);
  a.reset();
  EXPECT_EQ(a.generation(), gen + 1);  // one block held everything: nothing replaced
}

TEST(Arena, ReleaseReusesScratchAndBoundsTheHighWater) {
  Arena a(Device::cpu(), 1 << 16);
  Tensor keep = a.alloc({64}, DType::kF32);
  for (int layer = 0; layer < 8; ++layer) {
    const Arena::Mark m = a.mark();
    Tensor s1 = a.alloc({1024}, DType::kF32);
    Tensor s2 = a.alloc({1024}, DType::kF32);
    EXPECT_EQ(addr(s1), addr(keep) + 256) << "layer " << layer;
    EXPECT_EQ(addr(s2), addr(s1) + 4096);
    a.release(m);
  }
  EXPECT_EQ(a.high_water(), 256u + 2 * 4096);  // one layer's scratch, not eight
  Tensor after = a.alloc({1}, DType::kF32);
  EXPECT_EQ(addr(after), addr(keep) + 256);
}

TEST(Arena, ReleaseAcrossBlocksReusesTheLaterBlocks) {
  Arena a(Device::cpu(), 1024);
  const char* first = addr(a.alloc({128}, DType::kF32));  // 512 of 1024 bytes
  const Arena::Mark m = a.mark();
  const char* big = addr(a.alloc({1024}, DType::kF32));  // a new block
  a.release(m);
  EXPECT_EQ(addr(a.alloc({128}, DType::kF32)), first + 512);
  // The first block is full now; the next allocation moves on to the block made before.
  EXPECT_EQ(addr(a.alloc({1024}, DType::kF32)), big);
}

TEST(Arena, ReleasingAStaleMarkIsAnError) {
  Arena a(Device::cpu(), 4096);
  a.alloc({16}, DType::kF32);
  const Arena::Mark outer = a.mark();
  a.alloc({16}, DType::kF32);
  const Arena::Mark inner = a.mark();
  a.release(outer);
  EXPECT_THROW(a.release(inner), Error);
}

}  // namespace atom
