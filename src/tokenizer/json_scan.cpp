#include "tokenizer/json_scan.h"

#include <cstring>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace atom::tokenizer {

void JsonScanner::error(std::string_view what) const {
  // Report a line number: byte offsets are hard to use in a 27 MB file.
  size_t line = 1;
  for (size_t i = 0; i < pos_ && i < s_.size(); ++i) line += s_[i] == '\n';
  fail("{}: invalid JSON at line {} (byte {}): {}", file_, line, pos_, what);
}

void JsonScanner::expect(char c) {
  if (peek() != c) error(fmt::format("expected '{}'", c));
  ++pos_;
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void JsonScanner::read_string(std::string& out) {
  out.clear();
  if (peek() != '"') error("expected a string");
  ++pos_;
  while (true) {
    // Copy the run up to the next quote or backslash in one go.
    const size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != '"' && s_[pos_] != '\\') {
      if (static_cast<unsigned char>(s_[pos_]) < 0x20) error("control character in string");
      ++pos_;
    }
    out.append(s_.data() + start, pos_ - start);
    if (pos_ >= s_.size()) error("unterminated string");
    if (s_[pos_] == '"') {
      ++pos_;
      break;
    }
    ++pos_;  // backslash
    if (pos_ >= s_.size()) error("unterminated escape");
    const char e = s_[pos_++];
    switch (e) {
      case '"':
        out.push_back('"');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '/':
        out.push_back('/');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'u': {
        auto read4 = [&]() -> uint32_t {
          if (pos_ + 4 > s_.size()) error("short \\u escape");
          uint32_t v = 0;
          for (int k = 0; k < 4; ++k) {
            const int h = hex_value(s_[pos_ + k]);
            if (h < 0) error("bad \\u escape");
            v = v * 16 + static_cast<uint32_t>(h);
          }
          pos_ += 4;
          return v;
        };
        uint32_t cp = read4();
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (pos_ + 6 <= s_.size() && s_[pos_] == '\\' && s_[pos_ + 1] == 'u') {
            pos_ += 2;
            const uint32_t lo = read4();
            if (lo < 0xDC00 || lo > 0xDFFF) error("unpaired surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else {
            error("unpaired surrogate in \\u escape");
          }
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          error("unpaired surrogate in \\u escape");
        }
        utf8_append(out, cp);
        break;
      }
      default:
        error("bad escape");
    }
  }
}

int64_t JsonScanner::read_int() {
  skip_ws();
  const size_t start = pos_;
  bool neg = false;
  if (pos_ < s_.size() && s_[pos_] == '-') {
    neg = true;
    ++pos_;
  }
  int64_t v = 0;
  size_t digits = 0;
  while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
    v = v * 10 + (s_[pos_] - '0');
    ++pos_;
    ++digits;
    if (digits > 15) error("integer too large");
  }
  if (digits == 0 ||
      (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))) {
    pos_ = start;
    error("expected an integer");
  }
  return neg ? -v : v;
}

void JsonScanner::skip_string() {
  ++pos_;  // opening quote
  while (pos_ < s_.size()) {
    const char c = s_[pos_];
    if (c == '\\') {
      pos_ += 2;
    } else if (c == '"') {
      ++pos_;
      return;
    } else {
      ++pos_;
    }
  }
  error("unterminated string");
}

std::string_view JsonScanner::skip_value(std::string_view what) {
  const char first = peek();
  const size_t start = pos_;
  if (first == '"') {
    skip_string();
  } else if (first == '{' || first == '[') {
    int depth = 0;
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == '"') {
        skip_string();
        continue;
      }
      if ((c == '{' || c == '[') && ++depth > kMaxNesting)
        error(fmt::format("{} nests objects and arrays deeper than {} levels", what, kMaxNesting));
      if (c == '}' || c == ']') {
        --depth;
        if (depth == 0) {
          ++pos_;
          break;
        }
      }
      ++pos_;
    }
    if (depth != 0) error("unterminated object or array");
  } else {
    // number, true, false, null
    while (pos_ < s_.size() && std::strchr(",}] \t\r\n", s_[pos_]) == nullptr) ++pos_;
    if (pos_ == start) error("expected a value");
  }
  return s_.substr(start, pos_ - start);
}

}  // namespace atom::tokenizer
