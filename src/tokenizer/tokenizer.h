// atom's tokenizer: loads a Hugging Face tokenizer.json (+ tokenizer_config.json) and produces
// exactly the ids the Hugging Face `tokenizers` library produces, and decodes them back.
// A Tokenizer is immutable after loading; encode/decode may run concurrently from many threads,
// and copies share the loaded tables.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace atom::tokenizer {

struct TokenizerImpl;

class Tokenizer {
 public:
  // dir holds tokenizer.json and optionally tokenizer_config.json.
  static Tokenizer from_dir(const std::filesystem::path& dir);
  static Tokenizer from_file(
      const std::filesystem::path& tokenizer_json,
      const std::optional<std::filesystem::path>& tokenizer_config = std::nullopt);
  // From the text of a tokenizer.json (and optionally of a tokenizer_config.json); `name` is used
  // in error messages.
  static Tokenizer from_json_text(std::string_view tokenizer_json,
                                  std::string_view name = "tokenizer.json",
                                  std::string_view tokenizer_config = {});

  // add_special_tokens = true runs the post-processor (TemplateProcessing adds BOS etc.), as
  // HF's encode(text, add_special_tokens=True). Text that is not valid UTF-8 is repaired first
  // (each invalid sequence becomes U+FFFD).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // HF's decode: unknown ids are dropped; skip_special_tokens drops added tokens marked special.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The bytes token `id` contributes to decoded text in the middle of a sequence (a byte-level
  // token's bytes, a "<0xNN>" byte, a "▁" as the space it decodes to), which may end inside a
  // UTF-8 character; std::nullopt for special tokens and unknown ids. What structured output
  // matches tokens with.
  std::optional<std::string> token_bytes(int32_t id) const;

  // -1 when the token is not in the vocabulary (added tokens first, then the model's).
  int32_t token_to_id(std::string_view token) const;
  // std::nullopt when the id has no token.
  std::optional<std::string> id_to_token(int32_t id) const;
  // HF get_vocab_size(with_added_tokens=true): distinct tokens of the model and added vocab.
  size_t vocab_size() const;
  // One past the largest id any token has (the number of embedding rows the ids need).
  int32_t id_limit() const;
  bool is_special(int32_t id) const;

  // From tokenizer_config.json (string or AddedToken object); empty / -1 when not set.
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  const std::string& pad_token() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t pad_id() const;
  // add_bos_token / add_eos_token of tokenizer_config.json (std::nullopt when absent). They are
  // informational: encode() follows tokenizer.json's post-processor, as HF tokenizers does.
  std::optional<bool> add_bos_token() const;
  std::optional<bool> add_eos_token() const;

  const TokenizerImpl& impl() const { return *impl_; }

 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const TokenizerImpl> impl_;
};

}  // namespace atom::tokenizer
