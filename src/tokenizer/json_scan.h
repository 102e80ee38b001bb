// A small JSON scanner for the two huge arrays of tokenizer.json (model.vocab and model.merges),
// which it reads straight into the vocabulary tables; every other value is cut out as raw text and
// parsed by nlohmann::json. A full DOM parse of a 27 MB tokenizer.json costs about 0.4 s; this
// path keeps loading well under that.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace atom::tokenizer {

class JsonScanner {
 public:
  JsonScanner(std::string_view text, std::string_view file) : s_(text), file_(file) {}

  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t'))
      ++pos_;
  }
  // Next non-space character, or '\0' at the end.
  char peek() {
    skip_ws();
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  void expect(char c);
  bool consume(char c) {
    if (peek() == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  // Reads a JSON string (escapes decoded) into out.
  void read_string(std::string& out);
  // Reads an integer.
  int64_t read_int();
  // Skips one value of any kind and returns its raw text. Objects and arrays nested deeper than
  // kMaxNesting are an error naming `what`: tokenizer.json components nest a few levels, and a
  // hostile file's 100,000 nested Sequences must not reach the recursive component builders.
  static constexpr int kMaxNesting = 64;
  std::string_view skip_value(std::string_view what = "a value");
  bool at_end() {
    skip_ws();
    return pos_ >= s_.size();
  }
  [[noreturn]] void error(std::string_view what) const;

 private:
  void skip_string();
  std::string_view s_;
  std::string_view file_;
  size_t pos_ = 0;
};

}  // namespace atom::tokenizer
