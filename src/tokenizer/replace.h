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
  // Replaces every non-overlapping match in s. Returns true when a non-empty match at offset 0
  // was replaced by nothing (the first character of s was dropped).
  bool apply(std::string& s) const;

 private:
  std::string literal_;
  std::string content_;
  std::unique_ptr<Regex> regex_;  // set for Regex patterns and for an empty String pattern
};

}  // namespace atom::tokenizer
