// Engram's compressed vocabulary (DeepSeek-V4.1; deepseek-ai/Engram's engram_demo_v1.py,
// ROCm/ATOM's atom/model_ops/engram.py): token ids that decode to the same text up to
// normalisation share one id, so an n-gram hash (layers/engram_hash.h) keys on what the text says.
//   text(id) = decode([id]) with special tokens kept
//   key(id)  = the raw token (id_to_token) when text holds U+FFFD (a byte fragment); else
//              normalize(text), or text itself when that is empty
//   normalize: NFKC, NFD, StripAccents, Lowercase, [ \t\r\n]+ -> " ", a text that is then exactly
//              " " kept as " " (through a U+E000 sentinel), Strip
//   lookup[id] = the keys' first-seen order over ids 0 .. vocab_size() - 1
// Built once per tokenizer (about a second for DeepSeek's 128,815 tokens).
#pragma once

#include <cstdint>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace atom::tokenizer {

struct CompressedVocab {
  std::vector<int64_t> lookup;  // [vocab_size()]: token id -> compressed id
  int64_t size = 0;             // compressed ids (engram_compressed_vocab_size)
  // lookup[id], ids outside the table (negative: padding) passed through.
  int64_t operator()(int64_t id) const {
    return id >= 0 && id < static_cast<int64_t>(lookup.size()) ? lookup[static_cast<size_t>(id)]
                                                               : id;
  }
};

CompressedVocab engram_compressed_vocab(const Tokenizer& tok);

}  // namespace atom::tokenizer
