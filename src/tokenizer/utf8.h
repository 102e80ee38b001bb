// UTF-8 helpers shared by the tokenizer: decoding one code point, validation, and lossy repair
// that matches Rust's String::from_utf8_lossy (one U+FFFD per maximal invalid subpart), which is
// what Hugging Face tokenizers uses when decoders produce bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace atom::tokenizer {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length in bytes of the UTF-8 sequence starting with lead byte b (1 for invalid lead bytes).
inline int utf8_seq_len(unsigned char b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) return 2;
  if ((b & 0xF0) == 0xE0) return 3;
  if ((b & 0xF8) == 0xF0) return 4;
  return 1;
}

// Decodes the code point at s[i] (s must be valid UTF-8) and advances i past it.
inline char32_t utf8_next(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  const int n = utf8_seq_len(b0);
  char32_t cp = n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void utf8_append(std::string& out, char32_t cp);

// Number of bytes of a valid UTF-8 sequence starting at s[i], or 0 when s[i..] does not start
// with one (truncated, overlong, surrogate, out of range, stray continuation byte).
size_t utf8_valid_seq(std::string_view s, size_t i);

bool utf8_is_valid(std::string_view s);

// Rust's from_utf8_lossy: each maximal invalid subpart becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);
void utf8_lossy_append(std::string& out, std::string_view bytes);

// True when s ends in the middle of a UTF-8 sequence that later bytes could still complete.
bool utf8_ends_incomplete(std::string_view s);

size_t utf8_char_count(std::string_view s);

}  // namespace atom::tokenizer
