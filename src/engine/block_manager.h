// The paged KV cache's bookkeeping: fixed-size blocks with reference counts, and prefix caching.
//
// A full block of a sequence is identified by a chained hash: xxhash64 over the previous block's
// hash and this block's token ids. Cached blocks keep their tokens and their parent (block id and
// generation), so a hit is verified exactly: the tokens must match and the parent must be the
// block matched one position earlier, so neither a hash collision nor a stale chain can hand a
// sequence someone else's KV. Freed blocks keep their hash and can be hit again until they are
// reallocated; free blocks are reused least recently freed first, never-cached ones before
// cached ones, and a sequence's tail blocks before its head (heads are shared more often).
//
// Everything is O(blocks touched): the free list is intrusive and doubly linked, so taking a hit
// block out of it, or allocating one, is O(1).
//
// Partitions (data-parallel attention: each rank's KV cache holds its own pages): blocks
// [p * B, (p + 1) * B) form partition p, with its own free list and its own prefix cache. A
// sequence takes every block from its partition (Sequence::partition), and hits only blocks
// cached there; the hash chain itself does not depend on the partition.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/sequence.h"

namespace atom {

// hash(parent hash, token ids of one full block). Replaceable in tests (to force collisions).
using BlockHasher = uint64_t (*)(uint64_t parent, const int32_t* tokens, int n);
uint64_t block_hash_xxh64(uint64_t parent, const int32_t* tokens, int n);

class BlockManager {
 public:
  // num_blocks split into `partitions` equal partitions (num_blocks must divide).
  BlockManager(int num_blocks, int block_size, bool enable_prefix_caching,
               BlockHasher hasher = block_hash_xxh64, int partitions = 1);

  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }
  int num_partitions() const { return static_cast<int>(parts_.size()); }
  int partition_blocks() const { return num_blocks_ / num_partitions(); }
  int partition_of(int block) const { return block / partition_blocks(); }
  // Blocks no sequence holds (including cached ones that can still be hit), in all partitions or
  // in partition p.
  int num_free_blocks() const { return num_free_; }
  int num_free_blocks(int p) const { return parts_.at(static_cast<size_t>(p)).num_free; }
  int num_used_blocks() const { return num_blocks_ - num_free_; }
  int num_cached_blocks() const;
  bool prefix_caching() const { return prefix_caching_; }

  // Cached blocks of seq's partition holding a prefix of seq's tokens, longest first-to-last
  // run, verified token by token. At most num_tokens - 1 tokens are covered: the last known token
  // is always computed so that its logits exist. Claims nothing.
  void find_cached_prefix(Sequence& seq, std::vector<int32_t>& hits);

  // Whether allocate(seq, hits, num_new_tokens) would succeed now (in seq's partition).
  bool can_allocate(const Sequence& seq, std::span<const int32_t> hits, int num_new_tokens) const;
  // Admission: takes `hits` (from find_cached_prefix, now) and allocates new blocks of seq's
  // partition so that the sequence can hold hits * block_size + num_new_tokens tokens. Returns
  // false (changing nothing) when there are not enough free blocks there.
  bool allocate(Sequence& seq, std::span<const int32_t> hits, int num_new_tokens);
  // A running sequence about to compute num_new_tokens more: grows its block table from its
  // partition. Returns false (changing nothing) when there are not enough free blocks there.
  bool append_slots(Sequence& seq, int num_new_tokens);
  // Returns every block of seq (reference counts down; blocks reaching zero become free, cached
  // ones stay hittable) and clears its table.
  void free(Sequence& seq);
  // Registers seq's full, computed blocks in the prefix cache (after a step advanced it).
  void cache_computed_blocks(Sequence& seq);

  // For tests: reference count of a block, and a full consistency check (throws on a bug).
  int ref_count(int block) const { return blocks_[block].ref_count; }
  // Bumped whenever the block's content is dropped: (block, generation) names one cached prefix.
  uint32_t generation(int block) const { return blocks_[block].gen; }
  void check_invariants() const;

 private:
  struct Block {
    int ref_count = 0;
    bool cached = false;  // has a hash and tokens registered in cached_
    uint64_t hash = 0;
    int parent = -1;  // block matched one position earlier (-1: first block)
    uint32_t parent_gen = 0;
    uint32_t gen = 0;          // bumped whenever the block's content is dropped
    int prev = -1, next = -1;  // free list links
    bool in_free_list = false;
  };

  // One partition's free list and prefix cache.
  struct Partition {
    std::unordered_map<uint64_t, int> cached;  // hash -> block
    int free_head = -1, free_tail = -1, num_free = 0;
  };
  Partition& part(int b) { return parts_[static_cast<size_t>(partition_of(b))]; }
  Partition& part_of(const Sequence& seq);
  const Partition& part_of(const Sequence& seq) const;

  void free_list_remove(int b);
  void free_list_push_front(int b);
  void free_list_push_back(int b);
  int take_free_block(Partition& p);  // allocates: pops the free list head, evicting its content
  void ensure_hashes(Sequence& seq, int num_full_blocks);
  const int32_t* block_tokens(int b) const {
    return &block_tokens_[static_cast<size_t>(b) * block_size_];
  }

  int num_blocks_, block_size_;
  bool prefix_caching_;
  BlockHasher hasher_;
  std::vector<Block> blocks_;
  std::vector<int32_t> block_tokens_;  // [num_blocks, block_size] tokens of cached blocks
  std::vector<Partition> parts_;
  int num_free_ = 0;  // over all partitions
};

}  // namespace atom
