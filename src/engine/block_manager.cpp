#include "engine/block_manager.h"

#define XXH_STATIC_LINKING_ONLY  // XXH64_state_t on the stack: no allocation per hash
#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "engine/multimodal.h"

namespace atom {

namespace {
constexpr uint64_t kRootHash = 0x61746f6d2d6b7631ull;  // parent of every sequence's first block

int ceil_div(int a, int b) { return (a + b - 1) / b; }
}  // namespace

uint64_t block_hash_xxh64(uint64_t parent, const int32_t* tokens, int n) {
  XXH64_state_t st;
  XXH64_reset(&st, 0);
  XXH64_update(&st, &parent, sizeof(parent));
  XXH64_update(&st, tokens, sizeof(int32_t) * static_cast<size_t>(n));
  return XXH64_digest(&st);
}

BlockManager::BlockManager(int num_blocks, int block_size, bool enable_prefix_caching,
                           BlockHasher hasher, int partitions)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      prefix_caching_(enable_prefix_caching),
      hasher_(hasher),
      blocks_(static_cast<size_t>(std::max(num_blocks, 0))),
      block_tokens_(enable_prefix_caching && num_blocks > 0
                        ? static_cast<size_t>(num_blocks) * block_size
                        : 0) {
  ATOM_CHECK(num_blocks > 0 && block_size > 0, "block manager: {} blocks of {}", num_blocks,
             block_size);
  ATOM_CHECK(partitions > 0 && num_blocks % partitions == 0,
             "block manager: {} blocks do not split into {} partitions", num_blocks, partitions);
  parts_.resize(static_cast<size_t>(partitions));
  for (int b = 0; b < num_blocks; ++b) free_list_push_back(b);
}

int BlockManager::num_cached_blocks() const {
  size_t n = 0;
  for (const Partition& p : parts_) n += p.cached.size();
  return static_cast<int>(n);
}

BlockManager::Partition& BlockManager::part_of(const Sequence& seq) {
  ATOM_CHECK(seq.partition >= 0 && seq.partition < num_partitions(),
             "block manager: partition {} of {}", seq.partition, num_partitions());
  return parts_[static_cast<size_t>(seq.partition)];
}

const BlockManager::Partition& BlockManager::part_of(const Sequence& seq) const {
  ATOM_CHECK(seq.partition >= 0 && seq.partition < num_partitions(),
             "block manager: partition {} of {}", seq.partition, num_partitions());
  return parts_[static_cast<size_t>(seq.partition)];
}

void BlockManager::free_list_remove(int b) {
  Block& k = blocks_[b];
  Partition& p = part(b);
  ATOM_CHECK(k.in_free_list, "block {} is not free", b);
  (k.prev >= 0 ? blocks_[k.prev].next : p.free_head) = k.next;
  (k.next >= 0 ? blocks_[k.next].prev : p.free_tail) = k.prev;
  k.prev = k.next = -1;
  k.in_free_list = false;
  --p.num_free;
  --num_free_;
}

void BlockManager::free_list_push_front(int b) {
  Block& k = blocks_[b];
  Partition& p = part(b);
  k.prev = -1;
  k.next = p.free_head;
  (p.free_head >= 0 ? blocks_[p.free_head].prev : p.free_tail) = b;
  p.free_head = b;
  k.in_free_list = true;
  ++p.num_free;
  ++num_free_;
}

void BlockManager::free_list_push_back(int b) {
  Block& k = blocks_[b];
  Partition& p = part(b);
  k.next = -1;
  k.prev = p.free_tail;
  (p.free_tail >= 0 ? blocks_[p.free_tail].next : p.free_head) = b;
  p.free_tail = b;
  k.in_free_list = true;
  ++p.num_free;
  ++num_free_;
}

int BlockManager::take_free_block(Partition& p) {
  const int b = p.free_head;
  ATOM_CHECK(b >= 0, "no free block");
  free_list_remove(b);
  Block& k = blocks_[b];
  if (k.cached) {  // evict: the content is about to be overwritten
    auto it = p.cached.find(k.hash);
    if (it != p.cached.end() && it->second == b) p.cached.erase(it);
    k.cached = false;
  }
  ++k.gen;
  k.parent = -1;
  k.ref_count = 1;
  return b;
}

void BlockManager::ensure_hashes(Sequence& seq, int num_full_blocks) {
  auto& h = seq.block_hashes;
  while (static_cast<int>(h.size()) < num_full_blocks) {
    const size_t i = h.size();
    uint64_t v =
        hasher_(i == 0 ? kRootHash : h[i - 1], seq.tokens.data() + i * block_size_, block_size_);
    // A block holding an image's placeholders is that image's too.
    if (seq.request && seq.request->images) {
      const int lo = static_cast<int>(i) * block_size_;
      v = prompt_images_hash(*seq.request->images, v, lo, lo + block_size_);
    }
    h.push_back(v);
  }
}

void BlockManager::find_cached_prefix(Sequence& seq, std::vector<int32_t>& hits) {
  hits.clear();
  if (!prefix_caching_) return;
  const int max_blocks = (seq.num_tokens() - 1) / block_size_;
  ensure_hashes(seq, max_blocks);
  const auto& cached = part_of(seq).cached;
  int parent = -1;
  uint32_t parent_gen = 0;
  for (int i = 0; i < max_blocks; ++i) {
    auto it = cached.find(seq.block_hashes[static_cast<size_t>(i)]);
    if (it == cached.end()) break;
    const int b = it->second;
    const Block& k = blocks_[b];
    // The hash only proposes a block; the parent link and the tokens decide.
    if (k.parent != parent || k.parent_gen != parent_gen) break;
    if (std::memcmp(block_tokens(b), seq.tokens.data() + static_cast<size_t>(i) * block_size_,
                    sizeof(int32_t) * block_size_) != 0)
      break;
    hits.push_back(b);
    parent = b;
    parent_gen = k.gen;
  }
}

bool BlockManager::can_allocate(const Sequence& seq, std::span<const int32_t> hits,
                                int num_new_tokens) const {
  const Partition& p = part_of(seq);
  const int hit_count = static_cast<int>(hits.size());
  const int need = ceil_div(hit_count * block_size_ + num_new_tokens, block_size_) - hit_count;
  int free_hits = 0;  // hit blocks that sit in the free list, so are counted as free
  for (int32_t b : hits) {
    ATOM_CHECK(partition_of(b) == seq.partition, "block {} is not of partition {}", b,
               seq.partition);
    free_hits += blocks_[b].ref_count == 0;
  }
  return need <= p.num_free - free_hits;
}

bool BlockManager::allocate(Sequence& seq, std::span<const int32_t> hits, int num_new_tokens) {
  ATOM_CHECK(seq.block_table.empty(), "allocate: sequence already holds {} blocks",
             seq.block_table.size());
  if (!can_allocate(seq, hits, num_new_tokens)) return false;
  Partition& p = part_of(seq);
  const int hit_count = static_cast<int>(hits.size());
  const int need = ceil_div(hit_count * block_size_ + num_new_tokens, block_size_) - hit_count;
  for (int32_t b : hits) {
    if (blocks_[b].ref_count == 0) free_list_remove(b);
    ++blocks_[b].ref_count;
    seq.block_table.push_back(b);
  }
  for (int i = 0; i < need; ++i) seq.block_table.push_back(take_free_block(p));
  seq.cache_cursor = hit_count;
  seq.cache_parent = hit_count ? hits.back() : -1;
  seq.cache_parent_gen = hit_count ? blocks_[hits.back()].gen : 0;
  return true;
}

bool BlockManager::append_slots(Sequence& seq, int num_new_tokens) {
  const int need = ceil_div(seq.num_computed_tokens + num_new_tokens, block_size_) -
                   static_cast<int>(seq.block_table.size());
  if (need <= 0) return true;
  Partition& p = part_of(seq);
  ATOM_CHECK(seq.block_table.empty() || partition_of(seq.block_table[0]) == seq.partition,
             "append_slots: the sequence holds blocks of partition {}, not {}",
             partition_of(seq.block_table[0]), seq.partition);
  if (need > p.num_free) return false;
  for (int i = 0; i < need; ++i) seq.block_table.push_back(take_free_block(p));
  return true;
}

void BlockManager::free(Sequence& seq) {
  // Tail first: a sequence's last blocks are evicted before its first ones, which other prompts
  // share more often.
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) {
    Block& k = blocks_[*it];
    ATOM_CHECK(k.ref_count > 0, "block {} freed more often than taken", *it);
    if (--k.ref_count > 0) continue;
    if (k.cached)
      free_list_push_back(*it);  // still worth a hit: evicted last
    else
      free_list_push_front(*it);  // holds nothing reusable: reused first
  }
  seq.block_table.clear();
  seq.cache_cursor = 0;
  seq.cache_parent = -1;
  seq.cache_parent_gen = 0;
}

void BlockManager::cache_computed_blocks(Sequence& seq) {
  if (!prefix_caching_ || seq.cache_cursor < 0) return;
  const int full =
      std::min(seq.num_computed_tokens / block_size_, static_cast<int>(seq.block_table.size()));
  if (seq.cache_cursor >= full) return;
  ensure_hashes(seq, full);
  auto& cached = part_of(seq).cached;
  for (int i = seq.cache_cursor; i < full; ++i) {
    const uint64_t h = seq.block_hashes[static_cast<size_t>(i)];
    const int32_t* toks = seq.tokens.data() + static_cast<size_t>(i) * block_size_;
    const int own = seq.block_table[static_cast<size_t>(i)];
    int canonical;
    auto it = cached.find(h);
    if (it == cached.end()) {
      Block& k = blocks_[own];
      ATOM_CHECK(!k.cached, "block {} is already cached under another hash", own);
      k.cached = true;
      k.hash = h;
      k.parent = seq.cache_parent;
      k.parent_gen = seq.cache_parent_gen;
      std::memcpy(&block_tokens_[static_cast<size_t>(own) * block_size_], toks,
                  sizeof(int32_t) * block_size_);
      cached.emplace(h, own);
      canonical = own;
    } else {
      const int b = it->second;
      const Block& k = blocks_[b];
      const bool same =
          b == own || (k.parent == seq.cache_parent && k.parent_gen == seq.cache_parent_gen &&
                       std::memcmp(block_tokens(b), toks, sizeof(int32_t) * block_size_) == 0);
      if (!same) {  // a collision: nothing after this block can be registered consistently
        seq.cache_cursor = -1;
        return;
      }
      canonical = b;  // an identical block is registered already; ours stays private
    }
    seq.cache_parent = canonical;
    seq.cache_parent_gen = blocks_[canonical].gen;
    seq.cache_cursor = i + 1;
  }
}

void BlockManager::check_invariants() const {
  const int B = partition_blocks();
  int total_free = 0;
  for (int q = 0; q < num_partitions(); ++q) {
    const Partition& p = parts_[static_cast<size_t>(q)];
    int free_count = 0, walked = 0;
    for (int b = q * B; b < (q + 1) * B; ++b) {
      const Block& k = blocks_[b];
      ATOM_CHECK(k.ref_count >= 0, "block {} has ref count {}", b, k.ref_count);
      ATOM_CHECK((k.ref_count == 0) == k.in_free_list, "block {}: ref count {} but in free list {}",
                 b, k.ref_count, k.in_free_list);
      free_count += k.in_free_list;
      if (k.cached) {
        auto it = p.cached.find(k.hash);
        ATOM_CHECK(it != p.cached.end() && it->second == b, "cached block {} is not in the map", b);
      }
    }
    for (int b = p.free_head, prev = -1; b >= 0; prev = b, b = blocks_[b].next) {
      ATOM_CHECK(blocks_[b].prev == prev, "free list broken at block {}", b);
      ATOM_CHECK(partition_of(b) == q, "block {} is in the free list of partition {}", b, q);
      ATOM_CHECK(++walked <= B, "free list has a cycle");
    }
    ATOM_CHECK(free_count == p.num_free && walked == p.num_free,
               "partition {}: free blocks: {} flagged, {} linked, {} counted", q, free_count,
               walked, p.num_free);
    total_free += p.num_free;
    for (const auto& [h, b] : p.cached)
      ATOM_CHECK(partition_of(b) == q && blocks_[b].cached && blocks_[b].hash == h,
                 "map entry for block {} is stale", b);
  }
  ATOM_CHECK(total_free == num_free_, "free blocks: {} in the partitions, {} counted", total_free,
             num_free_);
}

}  // namespace atom
