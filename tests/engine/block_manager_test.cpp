// BlockManager: invariants under random operation sequences, reference counts, verified prefix
// hits (a hash hit with different tokens is rejected), and LRU reuse of freed cached blocks.
//
// A shadow cache stands in for the KV: computing position p of a sequence writes a fingerprint of
// tokens[0..p] into the slot. A prefix hit is correct exactly when every hit slot holds the
// fingerprint this sequence would have written, which is checked independently of the manager.
#include "engine/block_manager.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "core/error.h"

namespace atom {
namespace {

uint64_t prefix_fingerprint(const std::vector<int32_t>& t, int upto) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i <= upto; ++i) h = (h ^ static_cast<uint64_t>(t[i] + 1)) * 1099511628211ull;
  return h;
}

struct Harness {
  BlockManager bm;
  std::vector<uint64_t> shadow;  // [num_blocks * block_size]
  std::vector<std::unique_ptr<Sequence>> live;

  Harness(int blocks, int bs, bool caching, BlockHasher h = block_hash_xxh64, int partitions = 1)
      : bm(blocks, bs, caching, h, partitions), shadow(static_cast<size_t>(blocks) * bs, 0) {}

  // Marks [num_computed, num_computed + n) computed, writing the shadow KV.
  void compute(Sequence& s, int n) {
    const int bs = bm.block_size();
    for (int p = s.num_computed_tokens; p < s.num_computed_tokens + n; ++p) {
      const int b = s.block_table.at(static_cast<size_t>(p / bs));
      ASSERT_EQ(bm.ref_count(b), 1) << "writing into a shared block";
      shadow[static_cast<size_t>(b) * bs + p % bs] = prefix_fingerprint(s.tokens, p);
    }
    s.num_computed_tokens += n;
    bm.cache_computed_blocks(s);
  }

  void check_hits(const Sequence& s, const std::vector<int32_t>& hits) {
    const int bs = bm.block_size();
    for (size_t i = 0; i < hits.size(); ++i)
      for (int o = 0; o < bs; ++o) {
        const int p = static_cast<int>(i) * bs + o;
        ASSERT_EQ(shadow[static_cast<size_t>(hits[i]) * bs + o], prefix_fingerprint(s.tokens, p))
            << "hit block " << hits[i] << " does not hold this prefix at position " << p;
      }
  }

  void check_refcounts() {
    bm.check_invariants();
    std::map<int, int> held;
    for (const auto& s : live)
      for (int32_t b : s->block_table) {
        ++held[b];
        ASSERT_EQ(bm.partition_of(b), s->partition) << "block " << b << " of another partition";
      }
    std::vector<int> free_in(static_cast<size_t>(bm.num_partitions()), 0);
    for (int b = 0; b < bm.num_blocks(); ++b)
      free_in[static_cast<size_t>(bm.partition_of(b))] += held[b] == 0;
    for (int p = 0; p < bm.num_partitions(); ++p)
      ASSERT_EQ(bm.num_free_blocks(p), free_in[static_cast<size_t>(p)]) << "partition " << p;
    int used = 0;
    for (int b = 0; b < bm.num_blocks(); ++b) {
      ASSERT_EQ(bm.ref_count(b), held[b]) << "block " << b;
      used += held[b] > 0;
    }
    ASSERT_EQ(bm.num_used_blocks(), used);
    ASSERT_EQ(bm.num_free_blocks() + bm.num_used_blocks(), bm.num_blocks());
  }
};

std::unique_ptr<Sequence> make_seq(std::vector<int32_t> tokens) {
  auto s = std::make_unique<Sequence>();
  s->num_prompt_tokens = static_cast<int>(tokens.size());
  s->tokens = std::move(tokens);
  return s;
}

// Random admissions, growth and frees; with partitions (data-parallel attention) each sequence
// takes a random partition, which every block it holds and every hit must belong to.
void random_operations(int partitions) {
  int64_t cross_partition_misses = 0;
  for (int trial = 0; trial < 40; ++trial) {
    std::mt19937 rng(1000 + trial);
    const int bs = 1 + static_cast<int>(rng() % 5);
    const bool caching = trial % 4 != 3;
    Harness h(partitions * (8 + static_cast<int>(rng() % 40)), bs, caching, block_hash_xxh64,
              partitions);
    // A few shared stems make prefix hits frequent.
    std::vector<std::vector<int32_t>> stems(3);
    for (auto& st : stems)
      for (int i = 0; i < 24; ++i) st.push_back(static_cast<int32_t>(rng() % 7));
    std::vector<int32_t> hits;
    int64_t total_hits = 0;
    for (int op = 0; op < 400; ++op) {
      const int kind = static_cast<int>(rng() % 4);
      if (kind == 0 || h.live.empty()) {  // admit a new sequence
        std::vector<int32_t> t = stems[rng() % stems.size()];
        t.resize(1 + rng() % t.size());
        for (int extra = static_cast<int>(rng() % 10); extra > 0; --extra)
          t.push_back(static_cast<int32_t>(rng() % 7));
        auto s = make_seq(t);
        s->partition = static_cast<int>(rng() % static_cast<unsigned>(partitions));
        if (partitions > 1 && caching) {
          // The same prompt in every partition: hits only where that partition cached it.
          for (int p = 0; p < partitions; ++p) {
            s->partition = p;
            h.bm.find_cached_prefix(*s, hits);
            for (int32_t b : hits) ASSERT_EQ(h.bm.partition_of(b), p);
            cross_partition_misses += hits.empty();
          }
          s->partition = static_cast<int>(rng() % static_cast<unsigned>(partitions));
        }
        h.bm.find_cached_prefix(*s, hits);
        ASSERT_LE(static_cast<int>(hits.size()) * bs, s->num_tokens() - 1);
        h.check_hits(*s, hits);
        const int free_part_before = h.bm.num_free_blocks(s->partition);
        const int cached = static_cast<int>(hits.size()) * bs;
        const int n = 1 + static_cast<int>(rng() % (s->num_tokens() - cached));
        const int free_before = h.bm.num_free_blocks();
        if (h.bm.allocate(*s, hits, n)) {
          total_hits += static_cast<int64_t>(hits.size());
          s->num_computed_tokens = cached;
          h.compute(*s, n);
          h.live.push_back(std::move(s));
        } else {
          ASSERT_EQ(h.bm.num_free_blocks(), free_before) << "failed allocate changed state";
          ASSERT_TRUE(s->block_table.empty());
          int free_hits = 0;  // hit blocks in the free list count as free
          for (int32_t x : hits) free_hits += h.bm.ref_count(x) == 0;
          ASSERT_LT(free_part_before - free_hits,
                    (cached + n + bs - 1) / bs - static_cast<int>(hits.size()))
              << "allocate failed with room in the sequence's partition";
        }
      } else if (kind == 1) {  // a running sequence computes more (appending a token if done)
        Sequence& s = *h.live[rng() % h.live.size()];
        if (s.num_computed_tokens == s.num_tokens())
          s.tokens.push_back(static_cast<int32_t>(rng() % 7));
        const int n = 1 + static_cast<int>(rng() % (s.num_tokens() - s.num_computed_tokens));
        if (h.bm.append_slots(s, n)) h.compute(s, n);
      } else {  // free one
        const size_t i = rng() % h.live.size();
        h.bm.free(*h.live[i]);
        h.live.erase(h.live.begin() + static_cast<std::ptrdiff_t>(i));
      }
      h.check_refcounts();
    }
    for (auto& s : h.live) h.bm.free(*s);
    h.live.clear();
    h.check_refcounts();
    EXPECT_EQ(h.bm.num_free_blocks(), h.bm.num_blocks());
    if (caching && trial == 0) {
      EXPECT_GT(total_hits, 0) << "the workload should produce hits";
    }
  }
  if (partitions > 1) {
    EXPECT_GT(cross_partition_misses, 0) << "some prefix should be cached in one partition only";
  }
}

TEST(BlockManager, RandomOperationsKeepInvariants) { random_operations(1); }

TEST(BlockManager, PartitionsKeepInvariantsAndTheirOwnBlocks) {
  random_operations(2);
  random_operations(3);
}

// Partition p owns blocks [p B, (p + 1) B): a sequence's blocks, its hits and the room it may use
// are its partition's alone.
TEST(BlockManager, PartitionsAllocateAndCacheApart) {
  Harness h(12, 2, true, block_hash_xxh64, 3);  // partitions of 4 blocks
  EXPECT_EQ(h.bm.partition_blocks(), 4);
  auto a = make_seq({1, 2, 3, 4, 5, 6, 7});
  a->partition = 1;
  std::vector<int32_t> hits;
  h.bm.find_cached_prefix(*a, hits);
  ASSERT_TRUE(h.bm.allocate(*a, hits, 7));
  for (int32_t b : a->block_table) EXPECT_TRUE(b >= 4 && b < 8) << b;
  EXPECT_EQ(h.bm.num_free_blocks(1), 0);
  EXPECT_EQ(h.bm.num_free_blocks(0), 4);
  h.compute(*a, 7);
  h.live.push_back(std::move(a));
  // Partition 1 is full: another sequence there does not fit, one in partition 2 does.
  auto b = make_seq({9, 9, 9});
  b->partition = 1;
  h.bm.find_cached_prefix(*b, hits);
  EXPECT_FALSE(h.bm.can_allocate(*b, hits, 3));
  EXPECT_FALSE(h.bm.allocate(*b, hits, 3));
  b->partition = 2;
  ASSERT_TRUE(h.bm.allocate(*b, hits, 3));
  for (int32_t x : b->block_table) EXPECT_GE(x, 8);
  // a's prefix is cached in partition 1 only.
  auto c = make_seq({1, 2, 3, 4, 5, 6, 7, 8});
  for (int p = 0; p < 3; ++p) {
    c->partition = p;
    h.bm.find_cached_prefix(*c, hits);
    EXPECT_EQ(hits.size(), p == 1 ? 3u : 0u) << "partition " << p;
  }
  // Growing past the partition fails even with free blocks elsewhere.
  Sequence& held = *h.live[0];
  held.tokens.push_back(8);
  held.tokens.push_back(9);
  EXPECT_FALSE(h.bm.append_slots(held, 2));
  EXPECT_GT(h.bm.num_free_blocks(), 2);
  h.bm.free(*b);
  h.check_refcounts();
  try {
    BlockManager bad(10, 4, true, block_hash_xxh64, 3);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("10 blocks do not split into 3 partitions"),
              std::string::npos)
        << e.what();
  }
}

TEST(BlockManager, SharedPrefixReferenceCounts) {
  Harness h(16, 4, true);
  h.live.push_back(make_seq({1, 2, 3, 4, 5, 6, 7, 8, 9}));
  Sequence& a = *h.live[0];
  std::vector<int32_t> hits;
  h.bm.find_cached_prefix(a, hits);
  EXPECT_TRUE(hits.empty());
  ASSERT_TRUE(h.bm.allocate(a, hits, 9));
  h.compute(a, 9);
  h.live.push_back(make_seq({1, 2, 3, 4, 5, 6, 7, 8, 10, 11}));
  Sequence& b = *h.live[1];
  h.bm.find_cached_prefix(b, hits);
  ASSERT_EQ(hits, (std::vector<int32_t>{a.block_table[0], a.block_table[1]}));
  ASSERT_TRUE(h.bm.allocate(b, hits, 2));
  EXPECT_EQ(h.bm.ref_count(a.block_table[0]), 2);
  EXPECT_EQ(h.bm.ref_count(a.block_table[1]), 2);
  h.check_refcounts();
  h.bm.free(a);
  EXPECT_EQ(h.bm.ref_count(b.block_table[0]), 1);
  h.bm.free(b);
  for (int blk = 0; blk < 16; ++blk) EXPECT_EQ(h.bm.ref_count(blk), 0);
  EXPECT_EQ(h.bm.num_free_blocks(), 16);
  h.live.clear();
  h.check_refcounts();
}

uint64_t constant_hash(uint64_t, const int32_t*, int) { return 42; }

TEST(BlockManager, HashHitWithDifferentTokensIsRejected) {
  Harness h(16, 4, true, constant_hash);  // every block collides
  auto a = make_seq({1, 2, 3, 4, 5, 6, 7, 8, 9});
  std::vector<int32_t> hits;
  ASSERT_TRUE(h.bm.allocate(*a, {}, 9));
  h.compute(*a, 9);
  EXPECT_EQ(h.bm.num_cached_blocks(), 1);  // block 1 collides with block 0 and stays private

  auto b = make_seq({9, 9, 9, 9, 5, 6, 7, 8, 1});
  h.bm.find_cached_prefix(*b, hits);
  EXPECT_TRUE(hits.empty()) << "the hash matched but the tokens differ";

  // Same first block: a genuine hit; the second block's hash points at block 0 again, whose
  // parent link cannot match, so the chain stops there.
  auto c = make_seq({1, 2, 3, 4, 5, 6, 7, 8, 1});
  h.bm.find_cached_prefix(*c, hits);
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_EQ(hits[0], a->block_table[0]);
  h.check_hits(*c, hits);
  h.bm.free(*a);
}

TEST(BlockManager, FreedCachedBlocksAreHitUntilReallocatedLeastRecentlyFreedFirst) {
  Harness h(8, 2, true);
  auto a = make_seq({1, 2, 3, 4, 5, 6, 7, 8});
  auto b = make_seq({11, 12, 13, 14, 15, 16, 17, 18});
  ASSERT_TRUE(h.bm.allocate(*a, {}, 8));
  h.compute(*a, 8);
  ASSERT_TRUE(h.bm.allocate(*b, {}, 8));
  h.compute(*b, 8);
  EXPECT_EQ(h.bm.num_free_blocks(), 0);
  const std::vector<int32_t> a_blocks = a->block_table, b_blocks = b->block_table;
  h.bm.free(*a);  // a's blocks are freed first, tail first: evicted first
  h.bm.free(*b);
  EXPECT_EQ(h.bm.num_cached_blocks(), 8);

  std::vector<int32_t> hits;
  auto a2 = make_seq({1, 2, 3, 4, 5, 6, 7, 8});
  h.bm.find_cached_prefix(*a2, hits);
  EXPECT_EQ(hits, std::vector<int32_t>(a_blocks.begin(), a_blocks.begin() + 3))
      << "freed blocks hit";

  auto c = make_seq({21, 22, 23, 24});
  ASSERT_TRUE(h.bm.allocate(*c, {}, 4));
  EXPECT_EQ(c->block_table, (std::vector<int32_t>{a_blocks[3], a_blocks[2]}))
      << "eviction takes the least recently freed block, a sequence's tail before its head";
  h.bm.find_cached_prefix(*a2, hits);
  EXPECT_EQ(hits, std::vector<int32_t>(a_blocks.begin(), a_blocks.begin() + 2));
  auto b2 = make_seq({11, 12, 13, 14, 15, 16, 17, 18});
  h.bm.find_cached_prefix(*b2, hits);
  EXPECT_EQ(hits, std::vector<int32_t>(b_blocks.begin(), b_blocks.begin() + 3));
  h.bm.free(*c);
  h.bm.check_invariants();
}

// The hit count for a workload whose sharing is known by construction (blocks of 4 tokens: X, Y,
// Z, W distinct, each sequence run to completion and freed before the next arrives):
//   1. X Y Z W a    nothing cached yet                                  0 blocks
//   2. X Y Z W b    shares all four blocks with 1                       4
//   3. Y Z W X c    the same block contents in another order: Y as a first block was never
//                   computed, so nothing matches                        0
//   4. Y Z W X d    shares all four with 3                              4
//   5. X X X X e    X as a first block is 1's                           1
//   6. X X X X f    shares all four with 5 (X after X after X ...)      4
// A block identified by its tokens alone (a hash that ignores its parent) gets every count right
// by luck except where the same contents recur under another parent: 3's and 5's blocks then
// collide with earlier ones and are never registered, so 4 and 6 find 0 and 1.
TEST(BlockManager, PrefixHitsOfAKnownSharingPattern) {
  Harness h(64, 4, true);
  const std::vector<int32_t> X = {11, 12, 13, 14}, Y = {21, 22, 23, 24}, Z = {31, 32, 33, 34},
                             W = {41, 42, 43, 44};
  auto cat = [](std::initializer_list<std::vector<int32_t>> parts, int32_t last) {
    std::vector<int32_t> t;
    for (const auto& p : parts) t.insert(t.end(), p.begin(), p.end());
    t.push_back(last);
    return t;
  };
  const std::vector<std::vector<int32_t>> prompts = {cat({X, Y, Z, W}, 1), cat({X, Y, Z, W}, 2),
                                                     cat({Y, Z, W, X}, 3), cat({Y, Z, W, X}, 4),
                                                     cat({X, X, X, X}, 5), cat({X, X, X, X}, 6)};
  const std::vector<size_t> want = {0, 4, 0, 4, 1, 4};
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto s = make_seq(prompts[i]);
    std::vector<int32_t> hits;
    h.bm.find_cached_prefix(*s, hits);
    EXPECT_EQ(hits.size(), want[i]) << "request " << i + 1;
    h.check_hits(*s, hits);
    ASSERT_TRUE(h.bm.allocate(*s, hits, s->num_tokens() - static_cast<int>(hits.size()) * 4));
    s->num_computed_tokens = static_cast<int>(hits.size()) * 4;
    h.compute(*s, s->num_tokens() - s->num_computed_tokens);
    h.bm.free(*s);
  }
  // Every distinct (parent chain, contents) block is registered: X Y Z W, Y Z W X, X X X X with
  // its first block shared with the first chain's.
  EXPECT_EQ(h.bm.num_cached_blocks(), 4 + 4 + 3);
  h.bm.check_invariants();
}

TEST(BlockManager, NoPrefixCachingNeverHits) {
  Harness h(8, 2, false);
  auto a = make_seq({1, 2, 3, 4, 5});
  ASSERT_TRUE(h.bm.allocate(*a, {}, 5));
  h.compute(*a, 5);
  h.bm.free(*a);
  std::vector<int32_t> hits;
  auto b = make_seq({1, 2, 3, 4, 5});
  h.bm.find_cached_prefix(*b, hits);
  EXPECT_TRUE(hits.empty());
  EXPECT_EQ(h.bm.num_cached_blocks(), 0);
}

TEST(BlockManager, AllocationFailsWithoutSideEffects) {
  Harness h(4, 4, true);
  auto a = make_seq(std::vector<int32_t>(17, 3));
  EXPECT_FALSE(h.bm.allocate(*a, {}, 17));  // needs 5 blocks
  EXPECT_TRUE(a->block_table.empty());
  EXPECT_EQ(h.bm.num_free_blocks(), 4);
  ASSERT_TRUE(h.bm.allocate(*a, {}, 16));
  a->num_computed_tokens = 16;
  EXPECT_FALSE(h.bm.append_slots(*a, 1));
  EXPECT_EQ(a->block_table.size(), 4u);
  h.bm.free(*a);
  h.bm.check_invariants();
}

}  // namespace
}  // namespace atom
