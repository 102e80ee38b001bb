// The Replace pattern shared by the Replace normalizer and the Replace decoder.
#pragma once

#include <memory>
#include <string>

#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"

namespace atom::tokenizer {

class Replacer {
 public:
  // j holds {"pattern": {"String": s} | {"Regex": r}, "content": c}.
  Replacer(const Json& j, const std::string& where);
  // Replaces every non-overlapping match in s. Returns true when the replacement moved the start
  // of s away from the input's first character (see moves_origin).
  bool apply(std::string& s) const;

 private:
  bool moves_origin(std::string_view match) const;
  std::string literal_;
  std::string content_;
  std::unique_ptr<Regex> regex_;  // set for Regex patterns and for an empty String pattern
};

}  // namespace atom::tokenizer
