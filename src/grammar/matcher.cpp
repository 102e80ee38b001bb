#include "grammar/matcher.h"

#include <omp.h>

#include <algorithm>
#include <mutex>
#include <numeric>

#include "core/error.h"
#include "core/parallel.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace atom::grammar {

namespace {
constexpr int kMaxExpandDepth = 100000;
// The smallest code point a UTF-8 sequence of `len` bytes may encode (shorter ones are overlong).
constexpr char32_t utf8_min_of_len(int len) { return len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000; }
}  // namespace

Matcher::Matcher(std::shared_ptr<const Grammar> g) : g_(g.get()), owner_(std::move(g)) {
  std::vector<Stack> init;
  for (uint32_t alt : g_->rule_alts[g_->root]) {
    Stack s;
    if (g_->items[alt].kind != Item::kEnd) s.push_back(alt);
    expand(std::move(s), init, 0);
  }
  set_stacks(std::move(init));
}

// Expands rule references at the top until every stack's top is a character set (or the stack is
// empty: the sentence can end there).
void Matcher::expand(Stack s, std::vector<Stack>& out, int depth) const {
  if (depth > kMaxExpandDepth) fail("grammar: rule expansion deeper than {}", kMaxExpandDepth);
  if (s.empty() || g_->items[s.back()].kind == Item::kChars) {
    out.push_back(std::move(s));
    if (out.size() > g_->limits.max_stacks * 4)
      fail("grammar: more than {} parse stacks (the grammar is too ambiguous)",
           g_->limits.max_stacks);
    return;
  }
  const uint32_t pos = s.back();
  const Item& it = g_->items[pos];
  s.pop_back();
  if (g_->items[pos + 1].kind != Item::kEnd) s.push_back(pos + 1);
  const auto& alts = g_->rule_alts[it.rule];
  for (size_t k = 0; k < alts.size(); ++k) {
    Stack t = (k + 1 == alts.size()) ? std::move(s) : s;
    if (g_->items[alts[k]].kind != Item::kEnd) t.push_back(alts[k]);
    expand(std::move(t), out, depth + 1);
  }
}

void Matcher::set_stacks(std::vector<Stack> next) {
  std::sort(next.begin(), next.end());
  next.erase(std::unique(next.begin(), next.end()), next.end());
  if (next.size() > g_->limits.max_stacks)
    fail("grammar: more than {} parse stacks (the grammar is too ambiguous)",
         g_->limits.max_stacks);
  stacks_ = std::move(next);
}

bool Matcher::accept_byte(uint8_t b) {
  char32_t cp = 0;
  bool complete = false;
  uint32_t partial = partial_;
  int len = partial_len_, need = partial_need_;
  if (need == 0) {
    if (b < 0x80) {
      cp = b;
      complete = true;
    } else {
      const int n = tokenizer::utf8_seq_len(b);
      if (n == 1) return false;  // a continuation byte or an invalid lead byte
      partial = n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
      len = 1;
      need = n;
    }
  } else {
    if ((b & 0xC0) != 0x80) return false;
    partial = (partial << 6) | (b & 0x3F);
    if (++len == need) {
      cp = partial;
      complete = true;
      // Only UTF-8 proper: no overlong forms, surrogates or code points past U+10FFFF (the
      // detokenizer would turn them into U+FFFD, which the grammar never allowed).
      if (cp < utf8_min_of_len(need) || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
        return false;
    }
  }
  if (!complete) {
    // Some stack must take a code point these bytes can still become.
    const int rest = 6 * (need - len);
    // The code points these bytes can still become; the shortest form of each length starts at
    // 0x80, 0x800 or 0x10000 (overlong forms are not UTF-8).
    const char32_t base = static_cast<char32_t>(partial) << rest;
    const char32_t lo = std::max(base, utf8_min_of_len(need));
    const char32_t hi = std::min<char32_t>(base | ((char32_t{1} << rest) - 1), 0x10FFFF);
    if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) return false;
    bool any = false;
    for (const Stack& s : stacks_)
      if (!s.empty() && g_->char_range_matches(g_->items[s.back()], lo, hi)) {
        any = true;
        break;
      }
    if (!any) return false;
    partial_ = partial, partial_len_ = len, partial_need_ = need;
    return true;
  }
  std::vector<Stack> next;
  for (const Stack& s : stacks_) {
    if (s.empty() || !g_->char_matches(g_->items[s.back()], cp)) continue;
    Stack t = s;
    const uint32_t pos = t.back();
    t.pop_back();
    if (g_->items[pos + 1].kind != Item::kEnd) t.push_back(pos + 1);
    expand(std::move(t), next, 0);
  }
  if (next.empty()) return false;
  set_stacks(std::move(next));
  partial_ = 0, partial_len_ = 0, partial_need_ = 0;
  return true;
}

bool Matcher::accept_bytes(std::string_view s) {
  Matcher copy = *this;
  for (char c : s)
    if (!copy.accept_byte(static_cast<uint8_t>(c))) return false;
  *this = std::move(copy);
  return true;
}

bool Matcher::accepting() const {
  if (partial_need_ != 0) return false;
  for (const Stack& s : stacks_)
    if (s.empty()) return true;
  return false;
}

bool Matcher::must_end() const {
  if (partial_need_ != 0) return false;
  for (const Stack& s : stacks_)
    if (!s.empty()) return false;
  return true;
}

std::string Matcher::key() const {
  std::string k;
  k.reserve(16 + stacks_.size() * 16);
  auto put = [&](uint32_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(partial_);
  put(static_cast<uint32_t>(partial_len_ | (partial_need_ << 8)));
  for (const Stack& s : stacks_) {
    put(static_cast<uint32_t>(s.size()));
    for (uint32_t v : s) put(v);
  }
  return k;
}

Matcher Matcher::with_stack(Stack s) const {
  Matcher m(*this);
  m.stacks_.clear();
  m.stacks_.push_back(std::move(s));
  m.partial_ = 0, m.partial_len_ = 0, m.partial_need_ = 0;
  return m;
}

bool Matcher::any_empty() const {
  for (const Stack& s : stacks_)
    if (s.empty()) return true;
  return false;
}

// --- TokenTrie ---

TokenTrie::TokenTrie(const std::vector<std::optional<std::string>>& bytes)
    : vocab_size_(static_cast<int64_t>(bytes.size())), bytes_(bytes) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < bytes.size(); ++i)
    if (bytes[i] && !bytes[i]->empty()) ids.push_back(static_cast<int32_t>(i));
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return *bytes[a] < *bytes[b]; });
  // Breadth first over sorted ranges: a node's tokens are those of its range whose bytes end at
  // its depth (they sort first); its children are the runs of equal next bytes.
  struct Range {
    uint32_t node;
    size_t lo, hi, depth;
  };
  nodes_.push_back({});
  child_byte_.push_back(0);
  std::vector<Range> queue = {{0, 0, ids.size(), 0}};
  for (size_t q = 0; q < queue.size(); ++q) {
    const Range r = queue[q];
    size_t i = r.lo;
    Node& n = nodes_[r.node];
    n.first_token = static_cast<uint32_t>(tokens_.size());
    while (i < r.hi && bytes[ids[i]]->size() == r.depth) tokens_.push_back(ids[i++]);
    nodes_[r.node].num_tokens = static_cast<uint32_t>(tokens_.size()) - nodes_[r.node].first_token;
    std::vector<std::pair<size_t, size_t>> runs;
    while (i < r.hi) {
      const char c = (*bytes[ids[i]])[r.depth];
      size_t j = i;
      while (j < r.hi && (*bytes[ids[j]])[r.depth] == c) ++j;
      runs.push_back({i, j});
      i = j;
    }
    const auto first = static_cast<uint32_t>(nodes_.size());
    nodes_[r.node].first_child = first;
    nodes_[r.node].num_children = static_cast<uint32_t>(runs.size());
    for (const auto& [a, b] : runs) {
      nodes_.push_back({});
      child_byte_.push_back(static_cast<uint8_t>((*bytes[ids[a]])[r.depth]));
      queue.push_back({static_cast<uint32_t>(nodes_.size() - 1), a, b, r.depth + 1});
    }
  }
  // Every node's tokens and its descendants' as one range (depth first, children after).
  subtree_tokens_.reserve(tokens_.size());
  std::vector<std::pair<uint32_t, bool>> todo = {{0, false}};
  while (!todo.empty()) {
    auto [node, done] = todo.back();
    todo.pop_back();
    Node& n = nodes_[node];
    if (done) {
      n.subtree_count = static_cast<uint32_t>(subtree_tokens_.size()) - n.subtree_first;
      continue;
    }
    n.subtree_first = static_cast<uint32_t>(subtree_tokens_.size());
    for (uint32_t t = n.first_token; t < n.first_token + n.num_tokens; ++t)
      subtree_tokens_.push_back(tokens_[t]);
    todo.push_back({node, true});
    for (uint32_t c = n.first_child + n.num_children; c-- > n.first_child;)
      todo.push_back({c, false});
  }
}

std::shared_ptr<const TokenTrie> TokenTrie::from_tokenizer(const tokenizer::Tokenizer& tok,
                                                           int64_t vocab_size) {
  std::vector<std::optional<std::string>> bytes(static_cast<size_t>(vocab_size));
  for (int64_t i = 0; i < vocab_size; ++i)
    bytes[static_cast<size_t>(i)] = tok.token_bytes(static_cast<int32_t>(i));
  return std::make_shared<TokenTrie>(bytes);
}

const std::string* TokenTrie::bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size_ || !bytes_[static_cast<size_t>(id)]) return nullptr;
  return &*bytes_[static_cast<size_t>(id)];
}

void TokenTrie::mark_tokens(const Node& n, std::span<uint64_t> bits) const {
  for (uint32_t t = n.first_token; t < n.first_token + n.num_tokens; ++t) {
    const auto id = static_cast<uint32_t>(tokens_[t]);
    bits[id / 64] |= uint64_t{1} << (id % 64);
  }
}

void TokenTrie::visit(uint32_t node, Matcher& m, std::span<uint64_t> allowed) const {
  const Node& n = nodes_[node];
  for (uint32_t c = n.first_child; c < n.first_child + n.num_children; ++c) {
    Matcher next = m;
    if (!next.accept_byte(child_byte_[c])) continue;
    mark_tokens(nodes_[c], allowed);
    if (nodes_[c].num_children) visit(c, next, allowed);
  }
}

bool TokenTrie::classify_child(uint32_t c, bool bottom, Matcher& next, std::span<uint64_t> accepted,
                               std::vector<int32_t>& uncertain) const {
  const Node& cn = nodes_[c];
  if (!next.accept_byte(child_byte_[c])) {
    if (bottom)
      uncertain.insert(uncertain.end(), subtree_tokens_.begin() + cn.subtree_first,
                       subtree_tokens_.begin() + cn.subtree_first + cn.subtree_count);
    return false;
  }
  mark_tokens(cn, accepted);
  return cn.num_children > 0;
}

void TokenTrie::visit_classify(uint32_t node, Matcher& m, bool bottom, std::span<uint64_t> accepted,
                               std::vector<int32_t>& uncertain) const {
  const Node& n = nodes_[node];
  // Once the suffix's bottom is reached, a byte it cannot take may still be taken by the stack
  // below: every token from here on that the suffix rejects is uncertain.
  bottom = bottom || m.any_empty();
  for (uint32_t c = n.first_child; c < n.first_child + n.num_children; ++c) {
    Matcher next = m;
    if (classify_child(c, bottom, next, accepted, uncertain))
      visit_classify(c, next, bottom, accepted, uncertain);
  }
}

void TokenTrie::classify(const Matcher& suffix, std::span<uint64_t> accepted,
                         std::vector<int32_t>& uncertain) const {
  ATOM_CHECK(static_cast<int64_t>(accepted.size()) * 64 >= vocab_size_,
             "mask of {} words for {} tokens", accepted.size(), vocab_size_);
  // A walk of a large vocabulary from a permissive state (inside a string: nearly every token)
  // visits most of the trie, tens of milliseconds on one core; its subtrees two bytes deep are
  // independent, so they fan out over threads (when the caller is not itself a parallel region:
  // a step's rows already are).
  struct Task {
    uint32_t node;
    Matcher m;
    bool bottom;
  };
  std::vector<Task> tasks;
  const bool bottom0 = suffix.any_empty();
  const Node& root = nodes_[0];
  const Matcher start = suffix.borrowed();
  for (uint32_t c = root.first_child; c < root.first_child + root.num_children; ++c) {
    Matcher next = start;
    if (classify_child(c, bottom0, next, accepted, uncertain))
      tasks.push_back({c, std::move(next), bottom0});
  }
  const auto n = static_cast<int64_t>(tasks.size());
  ParallelErrors errors;
  std::mutex mu;
#pragma omp parallel if (n >= 16 && vocab_size_ >= 32768 && !omp_in_parallel())
  {
    std::vector<uint64_t> acc(accepted.size(), 0);
    std::vector<int32_t> unc;
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t k = 0; k < n; ++k)
      errors.guard([&] {
        Task& t = tasks[static_cast<size_t>(k)];
        visit_classify(t.node, t.m, t.bottom, acc, unc);
      });
    std::lock_guard<std::mutex> lock(mu);
    for (size_t w = 0; w < acc.size(); ++w) accepted[w] |= acc[w];
    uncertain.insert(uncertain.end(), unc.begin(), unc.end());
  }
  errors.rethrow();
}

void TokenTrie::fill_allowed(const Matcher& m, std::span<uint64_t> allowed) const {
  ATOM_CHECK(static_cast<int64_t>(allowed.size()) * 64 >= vocab_size_,
             "mask of {} words for {} tokens", allowed.size(), vocab_size_);
  Matcher start = m.borrowed();
  visit(0, start, allowed);
}

// --- GrammarConstraint ---

namespace {

class GrammarState final : public LogitsConstraintState {
 public:
  GrammarState(const GrammarConstraint& c) : c_(c), m_(c.grammar()) {}
  void fill_allowed(std::span<uint64_t> allowed, std::span<const int32_t> eos_ids) override {
    c_.fill(m_, allowed);
    if (m_.accepting())
      for (int32_t e : eos_ids)
        if (e >= 0 && static_cast<size_t>(e) / 64 < allowed.size())
          allowed[static_cast<size_t>(e) / 64] |= uint64_t{1} << (e % 64);
  }
  bool accept(int32_t token) override {
    const std::string* b = c_.trie().bytes(token);
    if (!b) return m_.accepting();  // an end-of-sequence id once complete
    return m_.accept_bytes(*b);
  }
  bool must_end() const override { return m_.must_end(); }

 private:
  const GrammarConstraint& c_;
  Matcher m_;
};

constexpr size_t kCacheBytes = 64u << 20;

}  // namespace

GrammarConstraint::GrammarConstraint(std::shared_ptr<const Grammar> g,
                                     std::shared_ptr<const TokenTrie> trie)
    : g_(std::move(g)), trie_(std::move(trie)) {}

std::unique_ptr<LogitsConstraintState> GrammarConstraint::start() const {
  return std::make_unique<GrammarState>(*this);
}

void GrammarConstraint::fill(const Matcher& m, std::span<uint64_t> allowed) const {
  const size_t words = static_cast<size_t>((trie_->vocab_size() + 63) / 64);
  const std::string key = m.key();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      for (size_t w = 0; w < words && w < allowed.size(); ++w) allowed[w] |= it->second[w];
      return;
    }
  }
  std::vector<uint64_t> mask(words, 0);
  if (m.mid_character()) {
    trie_->fill_allowed(m, mask);
  } else {
    for (const Matcher::Stack& s : m.stacks()) {
      if (s.empty()) continue;  // the text may end: the caller adds the end of sequence
      const size_t depth = std::min(s.size(), kSuffixDepth);
      const auto sm =
          suffix_mask(Matcher::Stack(s.end() - static_cast<std::ptrdiff_t>(depth), s.end()));
      for (size_t w = 0; w < words; ++w) mask[w] |= sm->accepted[w];
      // A suffix that is the whole stack is exact: its uncertain tokens would need more bytes
      // after the end of the text.
      if (depth == s.size() || sm->uncertain.empty()) continue;
      const Matcher whole = m.borrowed().with_stack(s);
      for (int32_t id : sm->uncertain) {
        const auto u = static_cast<uint32_t>(id);
        if ((mask[u / 64] >> (u % 64)) & 1) continue;
        Matcher c = whole;
        if (c.accept_bytes(*trie_->bytes(id))) mask[u / 64] |= uint64_t{1} << (u % 64);
      }
    }
  }
  for (size_t w = 0; w < words && w < allowed.size(); ++w) allowed[w] |= mask[w];
  std::lock_guard<std::mutex> lock(mu_);
  if ((cache_.size() + 1) * words * 8 > kCacheBytes) cache_.clear();
  cache_.emplace(key, std::move(mask));
}

std::shared_ptr<const GrammarConstraint::SuffixMask> GrammarConstraint::suffix_mask(
    const Matcher::Stack& suffix) const {
  std::string key(reinterpret_cast<const char*>(suffix.data()), suffix.size() * sizeof(uint32_t));
  {
    std::lock_guard<std::mutex> lock(suffix_mu_);
    auto it = suffix_cache_.find(key);
    if (it != suffix_cache_.end()) return it->second;
  }
  auto sm = std::make_shared<SuffixMask>();
  sm->accepted.assign(static_cast<size_t>((trie_->vocab_size() + 63) / 64), 0);
  Matcher top(g_);
  trie_->classify(top.with_stack(suffix), sm->accepted, sm->uncertain);
  std::sort(sm->uncertain.begin(), sm->uncertain.end());
  sm->uncertain.erase(std::unique(sm->uncertain.begin(), sm->uncertain.end()), sm->uncertain.end());
  const size_t bytes = sm->accepted.size() * 8 + sm->uncertain.size() * 4;
  std::lock_guard<std::mutex> lock(suffix_mu_);
  if (suffix_bytes_ + bytes > kCacheBytes) {
    suffix_cache_.clear();
    suffix_bytes_ = 0;
  }
  auto [it, inserted] = suffix_cache_.emplace(std::move(key), sm);
  if (inserted) suffix_bytes_ += bytes;
  return it->second;
}

}  // namespace atom::grammar
