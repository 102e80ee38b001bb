// Decoders of tokenizer.json: turn token strings back into text (ByteLevel, Metaspace, Replace,
// ByteFallback, Fuse, Strip, BPEDecoder, WordPiece, Sequence). As in HF, each decoder maps the
// list of token strings to a new list and the final text is their concatenation.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json_util.h"

namespace atom::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // True when a ByteFallback decoder is part of the chain: then a "<0xNN>" run decodes as a
  // whole (an invalid run becomes one U+FFFD per byte), which streaming has to respect.
  virtual bool has_byte_fallback() const { return false; }
  // True when a ByteLevel decoder is part of the chain: a token's characters stand for bytes.
  virtual bool is_byte_level() const { return false; }
};

// "<0xNN>": what the ByteFallback decoder reads as one byte.
bool is_byte_fallback_token(std::string_view token);

std::unique_ptr<Decoder> decoder_from_json(const Json& j, const std::string& where);

}  // namespace atom::tokenizer
