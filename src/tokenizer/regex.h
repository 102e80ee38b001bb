// Regular expressions for tokenizer.json patterns, on PCRE2 (UTF + UCP, JIT when available).
// Hugging Face tokenizers compiles these with Oniguruma (Ruby syntax); the few places where
// PCRE2 reads a pattern differently are rewritten before compiling (see regex.cpp).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace atom::tokenizer {

class Regex {
 public:
  // Throws atom::Error naming `what` (e.g. "pre_tokenizer Split pattern") when it does not compile.
  Regex(std::string_view pattern, std::string_view what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every match in s as byte ranges [start, end), iterated the way Oniguruma's find_iter does
  // (an empty match right where the previous match ended is skipped). s must be valid UTF-8.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

// The pattern rewritten for PCRE2 so that it means what Oniguruma reads (exposed for tests).
std::string regex_onig_to_pcre2(std::string_view pattern);

}  // namespace atom::tokenizer
