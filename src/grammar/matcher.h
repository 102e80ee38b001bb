// Matching a compiled Grammar one byte at a time, and masking a vocabulary with it.
//
// The matcher holds the set of parse stacks (as llama.cpp's grammar sampler does): each stack is
// the items still to match, innermost last, expanded until its top is a character set. A byte
// that completes a UTF-8 character advances every stack whose top matches it; bytes of a character
// still being read are kept and checked against the range of code points they can still become.
// A token is allowed when the matcher survives all of its bytes, which a trie of the vocabulary's
// byte strings checks for every token at once, sharing the work of common prefixes. Masks are
// cached per matcher state: inside a JSON string, say, the state repeats step after step.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/logits_constraint.h"
#include "grammar/grammar.h"

namespace atom::tokenizer {
class Tokenizer;
}

namespace atom::grammar {

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> g);

  // Consumes one byte; false (and the matcher unchanged) when no parse can take it.
  bool accept_byte(uint8_t b);
  bool accept_bytes(std::string_view s);
  // The text so far is a complete sentence of the grammar.
  bool accepting() const;
  // No character can follow (every stack is empty).
  bool must_end() const;
  // A key of the state, equal for states that allow the same continuations.
  std::string key() const;

  // Parse stacks (bottom first; each top is a character set), for the mask's context split.
  using Stack = std::vector<uint32_t>;
  const std::vector<Stack>& stacks() const { return stacks_; }
  // A matcher in the state of one stack alone (no UTF-8 character half read).
  Matcher with_stack(Stack s) const;
  // Some stack is empty: the text may end here (for a stack's suffix: its bottom was reached).
  bool any_empty() const;
  // A UTF-8 character is half read.
  bool mid_character() const { return partial_need_ != 0; }
  // A copy that does not own the grammar: valid while this matcher (or another owner) lives.
  Matcher borrowed() const {
    Matcher m(*this);
    m.owner_.reset();
    return m;
  }

 private:
  friend class TokenTrie;
  void expand(Stack s, std::vector<Stack>& out, int depth) const;
  void set_stacks(std::vector<Stack> next);

  // The grammar, and its owner: null in a borrowed copy (below), which copies without touching
  // the shared count (mask walks copy a matcher per trie node, on many threads at once).
  const Grammar* g_;
  std::shared_ptr<const Grammar> owner_;
  std::vector<Stack> stacks_;
  // A UTF-8 character being read: its bytes so far and how many it needs.
  uint32_t partial_ = 0;
  int partial_len_ = 0, partial_need_ = 0;
};

// The byte strings of a vocabulary's tokens in a trie. Tokens with no text (special tokens) are
// left out: a grammar never allows them.
class TokenTrie {
 public:
  // bytes[id]: the token's bytes, std::nullopt for a token the grammar may not produce.
  explicit TokenTrie(const std::vector<std::optional<std::string>>& bytes);
  static std::shared_ptr<const TokenTrie> from_tokenizer(const tokenizer::Tokenizer& tok,
                                                         int64_t vocab_size);

  int64_t vocab_size() const { return vocab_size_; }
  const std::string* bytes(int32_t id) const;
  // Sets the bit of every token whose bytes the matcher accepts from its current state.
  void fill_allowed(const Matcher& m, std::span<uint64_t> allowed) const;
  // For a matcher holding the top of a stack (its suffix): sets in `accepted` the tokens it
  // accepts, which the whole stack accepts as well, and lists in `uncertain` the tokens it
  // rejects after its bottom was reached (any_empty) before their last byte: only the whole
  // stack can tell those. Every other token the whole stack rejects too.
  void classify(const Matcher& suffix, std::span<uint64_t> accepted,
                std::vector<int32_t>& uncertain) const;

 private:
  struct Node {
    uint32_t first_child = 0, num_children = 0;
    uint32_t first_token = 0, num_tokens = 0;
    uint32_t subtree_first = 0, subtree_count = 0;  // into subtree_tokens_
  };
  void mark_tokens(const Node& n, std::span<uint64_t> bits) const;  // n's own tokens
  void visit(uint32_t node, Matcher& m, std::span<uint64_t> allowed) const;
  // One child c of a classify walk, `next` a copy of its parent's matcher: marks c's tokens if
  // `next` takes c's byte, else lists c's subtree as uncertain when `bottom`. True when c was
  // taken and has children to walk.
  bool classify_child(uint32_t c, bool bottom, Matcher& next, std::span<uint64_t> accepted,
                      std::vector<int32_t>& uncertain) const;
  void visit_classify(uint32_t node, Matcher& m, bool bottom, std::span<uint64_t> accepted,
                      std::vector<int32_t>& uncertain) const;

  int64_t vocab_size_ = 0;
  std::vector<std::optional<std::string>> bytes_;
  std::vector<Node> nodes_;
  std::vector<uint8_t> child_byte_;  // per node: the byte leading to it
  std::vector<int32_t> tokens_;
  std::vector<int32_t> subtree_tokens_;  // depth first: each node's tokens, then its children's
};

// A grammar as the engine's LogitsConstraint: each sequence's state is a Matcher; masks are
// shared through a cache keyed by matcher state.
class GrammarConstraint final : public LogitsConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenTrie> trie);
  std::unique_ptr<LogitsConstraintState> start() const override;

  // The mask for matcher m (cached per state). A state's mask is the union over its stacks of
  // what each stack allows; a stack's is found from its top kSuffixDepth items alone (cached per
  // suffix: the grammar has few), checking against the whole stack only the tokens the suffix
  // leaves uncertain (TokenTrie::classify). A half-read UTF-8 character walks the trie whole.
  void fill(const Matcher& m, std::span<uint64_t> allowed) const;
  static constexpr size_t kSuffixDepth = 3;
  const TokenTrie& trie() const { return *trie_; }
  const std::shared_ptr<const Grammar>& grammar() const { return g_; }

 private:
  std::shared_ptr<const Grammar> g_;
  std::shared_ptr<const TokenTrie> trie_;
  struct SuffixMask {
    std::vector<uint64_t> accepted;
    std::vector<int32_t> uncertain;
  };
  std::shared_ptr<const SuffixMask> suffix_mask(const Matcher::Stack& suffix) const;

  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::vector<uint64_t>> cache_;
  mutable std::mutex suffix_mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<const SuffixMask>> suffix_cache_;
  mutable size_t suffix_bytes_ = 0;
};

}  // namespace atom::grammar
