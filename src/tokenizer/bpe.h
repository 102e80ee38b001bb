// The BPE model of tokenizer.json: splits one pre-tokenized word into vocabulary ids by applying
// merges in rank order (lowest first, leftmost first on ties), exactly as Hugging Face's
// models/bpe does, with byte_fallback, unk fusing, ignore_merges and subword prefix/suffix.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace atom::tokenizer {

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::optional<std::string> continuing_subword_prefix;
  std::optional<std::string> end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

// Merges as read from the file, before they are resolved to ids: text of both sides of each
// merge, stored back to back in one arena.
struct RawMerges {
  std::string arena;
  std::vector<std::array<uint32_t, 4>> spans;  // {a_off, a_len, b_off, b_len}
  void add(std::string_view a, std::string_view b);
};

class BpeModel {
 public:
  // `where` names the file for error messages.
  BpeModel(TokenTable vocab, const RawMerges& merges, BpeOptions options, std::string_view where);
  ~BpeModel();

  // Appends the ids of word (non-empty, valid UTF-8) to out.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  const TokenTable& vocab() const { return vocab_; }
  const BpeOptions& options() const { return options_; }
  size_t merge_count() const { return merges_.size(); }

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  TokenTable vocab_;
  MergeTable merges_;
  BpeOptions options_;
  int32_t unk_id_ = -1;
  std::array<int32_t, 256> byte_ids_{};  // ids of "<0xNN>" tokens (-1 when missing)
  // Ids of single-character tokens below U+10000 (-1 when not in the vocabulary), so splitting a
  // word into characters needs no hashing; only used without subword prefix/suffix.
  std::vector<int32_t> char_ids_;
  struct Cache;
  std::unique_ptr<Cache> cache_;
};

}  // namespace atom::tokenizer
