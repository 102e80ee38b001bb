// How the engine turns generated ids into text, without depending on a tokenizer: a per-sequence
// stream fed one id at a time (the shape of an incremental detokenizer), made by a factory the
// embedding program supplies. Stop strings are matched on this text.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace atom {

class TokenTextStream {
 public:
  virtual ~TokenTextStream() = default;
  // Adds one generated id; returns the text that became final with it (may be empty while, for
  // example, a UTF-8 character is incomplete).
  virtual std::string append(int32_t id) = 0;
  // End of generation: whatever text is still held back.
  virtual std::string finish() = 0;
};

// Makes the stream of one sequence. prompt_ids are context only (their text is never emitted).
using TextStreamFactory = std::function<std::unique_ptr<TokenTextStream>(
    std::span<const int32_t> prompt_ids, bool skip_special_tokens)>;

// A detokenizer for tests and tools: every id maps to a fixed piece of text (ids outside the table
// map to ""), so output text is the concatenation of the pieces.
class PieceTextStream : public TokenTextStream {
 public:
  explicit PieceTextStream(std::shared_ptr<const std::vector<std::string>> pieces)
      : pieces_(std::move(pieces)) {}
  std::string append(int32_t id) override;
  std::string finish() override { return {}; }

 private:
  std::shared_ptr<const std::vector<std::string>> pieces_;
};

TextStreamFactory piece_text_stream_factory(std::vector<std::string> pieces);

// Where the earliest stop string occurs in `text` when the text before `new_from` is known to hold
// none: returns (position, index into stops), or nothing. Only the tail that can contain a new
// match is searched, so checking after every token costs O(piece + longest stop string).
struct StopMatch {
  size_t pos;
  size_t stop_index;
};
std::optional<StopMatch> stop_string_find(const std::string& text, size_t new_from,
                                          const std::vector<std::string>& stops);

}  // namespace atom
