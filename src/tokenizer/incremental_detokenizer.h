// Streaming detokenization: fed one id at a time, returns the text that is now final.
//
// Decoding is not a per-token map (the decode of [a, b] is not decode(a) + decode(b)): byte-level
// and byte-fallback tokens can end inside a UTF-8 character, and Metaspace/Strip decoders treat the
// first token of a sequence differently. So, as vLLM's detokenize_incrementally does, each step
// decodes a short window of recent ids twice, ids[prefix, read) and ids[prefix, end), and emits
// the difference once the window's text does not end in U+FFFD (an incomplete character). The
// window starts where the previous emitted text ended, so the concatenation of everything emitted,
// plus finish(), equals decode(all ids). With a ByteFallback decoder a run of "<0xNN>" tokens is
// held until it is closed, because HF decodes the run as a whole.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace atom::tokenizer {

class IncrementalDetokenizer {
 public:
  // prompt_ids, when given, are context only: their text is never emitted, but the first
  // generated tokens are decoded after them (so a leading "▁" after a prompt becomes a space).
  IncrementalDetokenizer(Tokenizer tokenizer, bool skip_special_tokens,
                         std::span<const int32_t> prompt_ids = {});

  // Adds one id and returns the newly completed text (often empty while a character is incomplete).
  // The returned text is always valid UTF-8.
  std::string add(int32_t id);
  // End of the stream: returns whatever is still held back; an incomplete character at the very
  // end becomes U+FFFD, as in decode().
  std::string finish();

  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  std::string step(bool final);
  bool in_byte_run() const;

  Tokenizer tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;  // start of the decode window
  size_t read_offset_ = 0;    // ids before this are already emitted
};

}  // namespace atom::tokenizer
