// Pre-tokenizers of tokenizer.json: they cut normalized text into the words the model sees
// (Split, ByteLevel, Metaspace, Digits, Punctuation, Whitespace, WhitespaceSplit, BertPreTokenizer,
// CharDelimiterSplit, FixedLength, Sequence).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json_util.h"

namespace atom::tokenizer {

struct PreToken {
  std::string text;
  // The piece starts at offset 0 of the input text (Metaspace prepend_scheme "first").
  bool at_origin = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces pieces by their sub-pieces; empty pieces are dropped, as HF does.
  virtual void pre_tokenize(std::vector<PreToken>& pieces) const = 0;
};

std::unique_ptr<PreTokenizer> pre_tokenizer_from_json(const Json& j, const std::string& where);

// One byte range of a piece and whether it matched the delimiter pattern.
struct SplitRange {
  size_t start, end;
  bool is_match;
};
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
SplitBehavior split_behavior_from_json(const Json& j, const std::string& where);
// Applies HF's SplitDelimiterBehavior to ranges covering `piece` and appends the kept pieces.
void split_apply(const PreToken& piece, std::vector<SplitRange>& ranges, SplitBehavior behavior,
                 std::vector<PreToken>& out);

}  // namespace atom::tokenizer
