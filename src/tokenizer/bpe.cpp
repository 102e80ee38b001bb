#include "tokenizer/bpe.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/scratch.h"
#include "tokenizer/utf8.h"

namespace atom::tokenizer {

void RawMerges::add(std::string_view a, std::string_view b) {
  const auto ao = static_cast<uint32_t>(arena.size());
  arena.append(a);
  const auto bo = static_cast<uint32_t>(arena.size());
  arena.append(b);
  spans.push_back({ao, static_cast<uint32_t>(a.size()), bo, static_cast<uint32_t>(b.size())});
}

// Word -> ids memo. Words repeat heavily in real text, so this removes most merge work. Sharded
// locks keep concurrent encoders from serialising on one mutex; a full shard is cleared, which
// bounds memory on a long-running server.
struct BpeModel::Cache {
  static constexpr size_t kShards = 16;
  static constexpr size_t kShardCapacity = 8192;
  static constexpr size_t kMaxWordBytes = 256;  // longer words are not worth keeping (as in HF)
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  std::array<Shard, kShards> shards;

  bool get(std::string_view word, size_t h, std::vector<int32_t>& out) {
    Shard& s = shards[h % kShards];
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.map.find(word);
    if (it == s.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void put(std::string_view word, size_t h, const int32_t* ids, size_t n) {
    Shard& s = shards[h % kShards];
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.map.size() >= kShardCapacity) s.map.clear();
    s.map.emplace(std::string(word), std::vector<int32_t>(ids, ids + n));
  }
};

BpeModel::BpeModel(TokenTable vocab, const RawMerges& merges, BpeOptions options,
                   std::string_view where)
    : vocab_(std::move(vocab)), options_(std::move(options)), cache_(std::make_unique<Cache>()) {
  const size_t prefix_len =
      options_.continuing_subword_prefix ? options_.continuing_subword_prefix->size() : 0;
  merges_.reserve(merges.spans.size());
  std::string joined;
  for (size_t i = 0; i < merges.spans.size(); ++i) {
    const auto& sp = merges.spans[i];
    const std::string_view a(merges.arena.data() + sp[0], sp[1]);
    const std::string_view b(merges.arena.data() + sp[2], sp[3]);
    const int32_t a_id = vocab_.find(a);
    const int32_t b_id = vocab_.find(b);
    if (a_id < 0 || b_id < 0) {
      fail("{}: model.merges[{}] ({:?} {:?}): token {:?} is not in model.vocab", where, i,
           std::string(a), std::string(b), std::string(a_id < 0 ? a : b));
    }
    if (b.size() < prefix_len) {
      fail("{}: model.merges[{}]: {:?} is shorter than continuing_subword_prefix", where, i,
           std::string(b));
    }
    joined.assign(a);
    joined.append(b.substr(prefix_len));
    const int32_t new_id = vocab_.find(joined);
    if (new_id < 0) {
      fail("{}: model.merges[{}]: merged token {:?} is not in model.vocab", where, i, joined);
    }
    merges_.insert(a_id, b_id, {static_cast<uint32_t>(i), new_id});
  }
  if (options_.unk_token) unk_id_ = vocab_.find(*options_.unk_token);
  for (int b = 0; b < 256; ++b) byte_ids_[b] = vocab_.find(fmt::format("<0x{:02X}>", b));
  if (!options_.continuing_subword_prefix && !options_.end_of_word_suffix) {
    char_ids_.assign(0x10000, -1);
    for (int32_t id = 0; id <= vocab_.max_id(); ++id) {
      const std::string_view t = vocab_.text(id);
      if (t.empty() ||
          static_cast<size_t>(utf8_seq_len(static_cast<unsigned char>(t[0]))) != t.size())
        continue;
      size_t i = 0;
      const char32_t c = utf8_next(t, i);
      // Only when the text maps back to this id (a duplicate text keeps its last id).
      if (c < 0x10000 && vocab_.find(t) == id) char_ids_[c] = id;
    }
  }
}

BpeModel::~BpeModel() = default;

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    const int32_t id = vocab_.find(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  const bool cacheable = word.size() < Cache::kMaxWordBytes;
  const size_t h = cacheable ? std::hash<std::string_view>{}(word) : 0;
  if (cacheable && cache_->get(word, h, out)) return;
  const size_t before = out.size();
  merge_word(word, out);
  if (cacheable) cache_->put(word, h, out.data() + before, out.size() - before);
}

namespace {
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t len;  // bytes covered; 0 once merged into its left neighbour
};
struct Candidate {
  uint32_t rank;
  uint32_t pos;
  int32_t new_id;
  // Min-heap on (rank, pos) through std::*_heap, which builds max-heaps.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};
struct Scratch {
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::string piece;
};
}  // namespace

void BpeModel::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  thread_local Scratch scratch;
  auto& symbols = scratch.symbols;
  auto& heap = scratch.heap;
  std::string& piece = scratch.piece;
  const ReleaseOnExit release(symbols, heap, piece);
  symbols.clear();
  heap.clear();

  auto add_symbol = [&](int32_t id, uint32_t len) {
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, len});
  };

  // Split into characters, mapping each to its id, to byte-fallback ids, or to unk.
  bool have_unk = false;
  int32_t unk_pending_id = -1;
  uint32_t unk_pending_len = 0;
  size_t i = 0;
  while (i < w.size()) {
    const size_t start = i;
    i += static_cast<size_t>(utf8_seq_len(static_cast<unsigned char>(w[i])));
    const bool is_first = start == 0;
    const bool is_last = i >= w.size();
    const auto byte_len = static_cast<uint32_t>(i - start);
    std::string_view s = w.substr(start, i - start);
    if ((!is_first && options_.continuing_subword_prefix) ||
        (is_last && options_.end_of_word_suffix)) {
      piece.clear();
      if (!is_first && options_.continuing_subword_prefix)
        piece.append(*options_.continuing_subword_prefix);
      piece.append(s);
      if (is_last && options_.end_of_word_suffix) piece.append(*options_.end_of_word_suffix);
      s = piece;
    }
    int32_t id;
    if (!char_ids_.empty() && byte_len <= 3) {
      size_t k = 0;
      id = char_ids_[utf8_next(s, k)];
    } else {
      id = vocab_.find(s);
    }
    if (id >= 0) {
      if (have_unk) {
        add_symbol(unk_pending_id, unk_pending_len);
        have_unk = false;
      }
      add_symbol(id, byte_len);
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (char c : s) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        // Note: a pending unk is not flushed here, matching HF's order of operations.
        for (char c : s) add_symbol(byte_ids_[static_cast<unsigned char>(c)], 1);
        continue;
      }
    }
    if (options_.unk_token) {
      if (unk_id_ < 0) {
        fail("BPE model: unk_token {:?} is not in the vocabulary", *options_.unk_token);
      }
      if (have_unk && options_.fuse_unk) {
        unk_pending_len += byte_len;
      } else {
        if (have_unk) add_symbol(unk_pending_id, unk_pending_len);
        have_unk = true;
        unk_pending_id = unk_id_;
        unk_pending_len = byte_len;
      }
    }
  }
  if (have_unk) add_symbol(unk_pending_id, unk_pending_len);

  // Merge, lowest rank first.
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const auto* m = merges_.find(symbols[k].id, symbols[k + 1].id)) {
      heap.push_back({m->rank, static_cast<uint32_t>(k), m->id});
    }
  }
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next < 0) continue;
    const auto next_pos = static_cast<size_t>(cur.next);
    const Symbol right = symbols[next_pos];
    const auto* m = merges_.find(cur.id, right.id);
    if (m == nullptr || m->id != top.new_id) continue;  // stale candidate
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0)
      symbols[static_cast<size_t>(right.next)].prev = static_cast<int32_t>(top.pos);
    if (cur.prev >= 0) {
      if (const auto* pm = merges_.find(symbols[static_cast<size_t>(cur.prev)].id, cur.id)) {
        heap.push_back({pm->rank, static_cast<uint32_t>(cur.prev), pm->id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
    if (cur.next >= 0) {
      if (const auto* nm = merges_.find(cur.id, symbols[static_cast<size_t>(cur.next)].id)) {
        heap.push_back({nm->rank, top.pos, nm->id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) out.push_back(s.id);
  }
}

}  // namespace atom::tokenizer
