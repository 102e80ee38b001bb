#include "tokenizer/replace.h"

#include <cctype>
#include <vector>

#include "tokenizer/utf8.h"

namespace atom::tokenizer {

Replacer::Replacer(const Json& j, const std::string& where) {
  const Json& pat = json_field(j, "pattern", where);
  content_ = json_string(j, "content", where);
  if (pat.is_object() && pat.contains("String")) {
    literal_ = json_string(pat, "String", where + ".pattern");
    // HF compiles the escaped literal as a regex; the empty one matches everywhere.
    if (literal_.empty()) regex_ = std::make_unique<Regex>("", where + ".pattern");
  } else if (pat.is_object() && pat.contains("Regex")) {
    regex_ =
        std::make_unique<Regex>(json_string(pat, "Regex", where + ".pattern"), where + ".pattern");
  } else {
    fail("{}.pattern: expected {{\"String\": ...}} or {{\"Regex\": ...}}", where);
  }
}

// HF aligns replacement text with the last character of what it replaces, and a removed match
// leaves the next character first. Either way, replacing a match at offset 0 moves the start of the
// text off the input's offset 0, unless the match is a single character that is replaced by
// something.
bool Replacer::moves_origin(std::string_view match) const {
  return content_.empty() || utf8_char_count(match) > 1;
}

bool Replacer::apply(std::string& s) const {
  if (regex_ == nullptr) {
    size_t m = s.find(literal_);
    if (m == std::string::npos) return false;
    const bool dropped_first = m == 0 && moves_origin(literal_);
    std::string out;
    out.reserve(s.size() + s.size() / 4);
    size_t pos = 0;
    while (m != std::string::npos) {
      out.append(s, pos, m - pos).append(content_);
      pos = m + literal_.size();
      m = s.find(literal_, pos);
    }
    out.append(s, pos, std::string::npos);
    s = std::move(out);
    return dropped_first;
  }
  thread_local std::vector<std::pair<size_t, size_t>> m;
  regex_->find_all(s, m);
  if (m.empty()) return false;
  const bool dropped_first = m[0].first == 0 && m[0].second > 0 &&
                             moves_origin(std::string_view(s).substr(0, m[0].second));
  std::string out;
  size_t pos = 0;
  for (auto [a, b] : m) {
    out.append(s, pos, a - pos).append(content_);
    pos = b;
  }
  out.append(s, pos, std::string::npos);
  s = std::move(out);
  return dropped_first;
}

}  // namespace atom::tokenizer
