// Compact lookup tables for large vocabularies: token text <-> id and merge pair -> (rank, id).
// Token bytes live in one arena and the hash tables use open addressing, so loading a 200k-token
// vocabulary costs a few allocations instead of hundreds of thousands.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace atom::tokenizer {

// The largest token id atom accepts: ids index a dense table (8 bytes each), and no released
// vocabulary comes near (the largest, about 262k). HF's tokenizers accept any u32; a checkpoint
// that numbers its tokens past this is refused by name rather than allocated for.
inline constexpr int32_t kMaxTokenId = (1 << 24) - 1;

class TokenTable {
 public:
  // Adds text with the given id; a text added twice keeps the last id (as a JSON map does).
  void add(std::string_view text, int32_t id);
  // -1 when absent.
  int32_t find(std::string_view text) const;
  // The text of id; empty view when id has no token (check has_id).
  std::string_view text(int32_t id) const;
  bool has_id(int32_t id) const;
  size_t size() const { return count_; }  // number of distinct texts
  int32_t max_id() const { return static_cast<int32_t>(id_off_.size()) - 1; }
  void reserve(size_t n);

 private:
  void grow();
  size_t slot_of(std::string_view text, size_t hash) const;

  std::string arena_;
  struct Entry {
    uint32_t off = 0, len = 0;
    int32_t id = -1;  // -1: empty slot
  };
  std::vector<Entry> slots_;                           // power-of-two size
  std::vector<std::pair<uint32_t, uint32_t>> id_off_;  // id -> (offset, length+1); 0 = none
  size_t count_ = 0;
};

// (left id, right id) -> (rank, merged id), for BPE merges.
class MergeTable {
 public:
  struct Value {
    uint32_t rank;
    int32_t id;
  };
  void reserve(size_t n);
  // A pair inserted twice keeps the last value, like the HashMap HF builds from the merges list.
  void insert(int32_t a, int32_t b, Value v);
  const Value* find(int32_t a, int32_t b) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = pack(a, b);
    size_t i = mix(key) & (slots_.size() - 1);
    while (true) {
      const Slot& s = slots_[i];
      if (s.key == kEmpty) return nullptr;
      if (s.key == key) return &s.value;
      i = (i + 1) & (slots_.size() - 1);
    }
  }
  size_t size() const { return count_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  void grow();
  struct Slot {
    uint64_t key = kEmpty;
    Value value{};
  };
  std::vector<Slot> slots_;
  size_t count_ = 0;
};

}  // namespace atom::tokenizer
