// Added tokens (tokenizer.json "added_tokens"): found in the text before the model runs, with
// HF's rules: leftmost-longest matching, non-normalized tokens matched on the raw text first,
// normalized ones on the normalized text, and lstrip / rstrip / single_word adjustments.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tokenizer/json_util.h"
#include "tokenizer/vocab.h"

namespace atom::tokenizer {

class Normalizer;

struct AddedToken {
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// One piece of text after splitting: either an added token (id >= 0) or text to tokenize.
struct TextSplit {
  std::string_view text;  // a view into the string that was split
  int32_t id = -1;
  size_t offset = 0;  // byte offset in that string
};

// Leftmost-longest multi-pattern matcher over bytes (a trie; the sets are a few hundred tokens).
class TokenTrie {
 public:
  void add(std::string_view pattern, int32_t value);
  // Longest pattern starting at s[pos]: its length and value, or {0, -1}.
  std::pair<size_t, int32_t> longest_at(std::string_view s, size_t pos) const;
  bool empty() const { return nodes_.size() <= 1; }
  bool may_start(unsigned char b) const { return first_[b]; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;
    int32_t value = -1;
  };
  std::vector<Node> nodes_{Node{}};
  bool first_[256] = {};
};

class AddedVocabulary {
 public:
  // HF's add_tokens: a token whose content is already known (added earlier or in the model vocab)
  // takes that id; a new one takes the next id after the model vocab (the "id" field of
  // tokenizer.json is not used, exactly as in HF). Then builds the matchers; normalized tokens are
  // matched against normalizer(content).
  void add_all(const std::vector<AddedToken>& tokens, const TokenTable& model_vocab,
               const Normalizer* normalizer);

  // Splits raw text by the non-normalized tokens.
  void split_raw(std::string_view text, std::vector<TextSplit>& out) const {
    split(text, raw_trie_, out);
  }
  // Splits normalized text by the normalized tokens.
  void split_normalized(std::string_view text, std::vector<TextSplit>& out) const {
    split(text, norm_trie_, out);
  }

  int32_t token_to_id(std::string_view content) const;
  const AddedToken* token_of(int32_t id) const;
  bool is_special_content(std::string_view content) const {
    return special_contents_.count(std::string(content)) > 0;
  }
  const std::unordered_map<int32_t, AddedToken>& tokens() const { return by_id_; }

 private:
  void split(std::string_view text, const TokenTrie& trie, std::vector<TextSplit>& out) const;

  std::unordered_map<std::string, int32_t> by_content_;
  std::unordered_map<int32_t, AddedToken> by_id_;
  std::unordered_set<std::string> special_contents_;
  TokenTrie raw_trie_, norm_trie_;
};

}  // namespace atom::tokenizer
