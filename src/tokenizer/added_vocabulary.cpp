#include "tokenizer/added_vocabulary.h"

#include <algorithm>

#include "tokenizer/normalizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace atom::tokenizer {

void TokenTrie::add(std::string_view pattern, int32_t value) {
  if (pattern.empty()) return;
  size_t node = 0;
  for (char ch : pattern) {
    const auto b = static_cast<unsigned char>(ch);
    auto& next = nodes_[node].next;
    auto it = std::find_if(next.begin(), next.end(), [b](const auto& e) { return e.first == b; });
    if (it == next.end()) {
      nodes_.push_back(Node{});
      nodes_[node].next.emplace_back(b, static_cast<int32_t>(nodes_.size() - 1));
      node = nodes_.size() - 1;
    } else {
      node = static_cast<size_t>(it->second);
    }
  }
  // With duplicate patterns the first one wins, like Aho-Corasick's lowest pattern index.
  if (nodes_[node].value < 0) nodes_[node].value = value;
  first_[static_cast<unsigned char>(pattern[0])] = true;
}

std::pair<size_t, int32_t> TokenTrie::longest_at(std::string_view s, size_t pos) const {
  size_t node = 0;
  std::pair<size_t, int32_t> best{0, -1};
  for (size_t i = pos; i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    const auto& next = nodes_[node].next;
    auto it = std::find_if(next.begin(), next.end(), [b](const auto& e) { return e.first == b; });
    if (it == next.end()) break;
    node = static_cast<size_t>(it->second);
    if (nodes_[node].value >= 0) best = {i + 1 - pos, nodes_[node].value};
  }
  return best;
}

void AddedVocabulary::add_all(const std::vector<AddedToken>& tokens, const TokenTable& model_vocab,
                              const Normalizer* normalizer) {
  std::vector<AddedToken> specials, others;
  for (const AddedToken& t : tokens) {
    if (t.special && !t.content.empty() && special_contents_.insert(t.content).second)
      specials.push_back(t);
  }
  auto same = [](const AddedToken& a, const AddedToken& b) {
    return a.content == b.content && a.single_word == b.single_word && a.lstrip == b.lstrip &&
           a.rstrip == b.rstrip && a.normalized == b.normalized && a.special == b.special;
  };
  std::vector<AddedToken> existing;
  const auto vocab_size = static_cast<int32_t>(model_vocab.size());
  int32_t next_id = vocab_size;
  for (const AddedToken& t : tokens) {
    if (t.content.empty()) continue;
    if (std::any_of(existing.begin(), existing.end(),
                    [&](const AddedToken& e) { return same(e, t); }))
      continue;
    int32_t id = token_to_id(t.content);
    if (id < 0) id = model_vocab.find(t.content);
    if (id < 0) id = next_id++;
    by_content_[t.content] = id;
    by_id_[id] = t;
    if (!special_contents_.count(t.content)) others.push_back(t);
    existing.push_back(t);
    // HF recomputes the next id from the largest added id once ids pass the model vocab.
    next_id = std::max(next_id, id >= vocab_size ? id + 1 : vocab_size);
  }
  for (const auto* list : {&specials, &others}) {
    for (const AddedToken& t : *list) {
      const int32_t id = token_to_id(t.content);
      if (!t.normalized) {
        raw_trie_.add(t.content, id);
      } else {
        std::string content = t.content;
        bool at_origin = true;
        if (normalizer) normalizer->normalize(content, at_origin);
        norm_trie_.add(content, id);
      }
    }
  }
}

int32_t AddedVocabulary::token_to_id(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? -1 : it->second;
}

const AddedToken* AddedVocabulary::token_of(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

namespace {
// Rust regex \w$ on the text before a match / ^\w on the text after it.
bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return uni_is_word_char(utf8_next(s, start));
}
bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  return uni_is_word_char(utf8_next(s, i));
}
// Start of the trailing whitespace run of s (\s*$).
size_t trailing_space_start(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t i = start;
    if (!uni_is_whitespace(utf8_next(s, i))) break;
    end = start;
  }
  return end;
}
// Length of the leading whitespace run of s (^\s*).
size_t leading_space_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!uni_is_whitespace(utf8_next(s, j))) break;
    i = j;
  }
  return i;
}
}  // namespace

void AddedVocabulary::split(std::string_view text, const TokenTrie& trie,
                            std::vector<TextSplit>& out) const {
  out.clear();
  if (trie.empty()) {
    if (!text.empty()) out.push_back({text, -1, 0});
    return;
  }
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!trie.may_start(static_cast<unsigned char>(text[pos]))) {
      ++pos;
      continue;
    }
    const auto [len, id] = trie.longest_at(text, pos);
    if (len == 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + len;
    pos = stop;  // matches never overlap, even when the one found here is rejected below
    const AddedToken& tok = by_id_.at(id);
    if (tok.single_word) {
      const bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
      const bool stop_space = stop == text.size() || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), start_offset);
    if (tok.rstrip) stop += leading_space_len(text.substr(stop));
    if (start_offset < start)
      out.push_back({text.substr(start_offset, start - start_offset), -1, start_offset});
    out.push_back({text.substr(start, stop - start), id, start});
    start_offset = stop;
    // The search goes on after the matched token itself, not after any stripped spaces (as the
    // Aho-Corasick iterator in HF does).
  }
  if (start_offset < text.size()) out.push_back({text.substr(start_offset), -1, start_offset});
}

}  // namespace atom::tokenizer
