// The loaded parts of a tokenizer (internal to src/tokenizer; the detokenizer uses it too).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"

namespace atom::tokenizer {

struct SpecialTokenInfo {
  std::string content;
  int32_t id = -1;
};

struct TokenizerImpl {
  std::string name;  // file name for messages
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  AddedVocabulary added;

  SpecialTokenInfo bos, eos, pad;
  std::optional<bool> add_bos_token, add_eos_token;

  // The token string decode() starts from for id; nullptr when the id is unknown or (with
  // skip_special) special.
  bool token_text(int32_t id, bool skip_special, std::string_view& out) const;
  // Decoder chain over token strings (joined with " " when there is no decoder, as in HF).
  std::string decode_tokens(std::vector<std::string>& tokens) const;
  void load_config(std::string_view text, std::string_view name);
};

// Reads tokenizer.json text into impl (fast path for model.vocab and model.merges).
void tokenizer_json_load(std::string_view text, std::string_view name, TokenizerImpl& impl);

}  // namespace atom::tokenizer
