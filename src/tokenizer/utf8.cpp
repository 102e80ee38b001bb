#include "tokenizer/utf8.h"

namespace atom::tokenizer {

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// The number of leading bytes of s[i..] that form a valid prefix of some UTF-8 sequence, following
// the Unicode table of well-formed byte sequences (it rejects overlongs and surrogates early, the
// way Rust's decoder does, so the maximal-subpart rule comes out the same).
static size_t valid_prefix(std::string_view s, size_t i, int& need) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 < 0x80) {
    need = 1;
    return 1;
  }
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    need = 0;
    return 0;
  }
  size_t k = 1;
  while (static_cast<int>(k) < need && i + k < s.size()) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < lo || b > hi) break;
    lo = 0x80;
    hi = 0xBF;
    ++k;
  }
  return k;
}

size_t utf8_valid_seq(std::string_view s, size_t i) {
  int need = 0;
  const size_t k = valid_prefix(s, i, need);
  return (need > 0 && static_cast<int>(k) == need) ? k : 0;
}

bool utf8_is_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8_valid_seq(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

void utf8_lossy_append(std::string& out, std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    while (j < s.size() && static_cast<unsigned char>(s[j]) < 0x80) ++j;
    out.append(s.data() + i, j - i);
    i = j;
    if (i >= s.size()) break;
    int need = 0;
    const size_t k = valid_prefix(s, i, need);
    if (need > 0 && static_cast<int>(k) == need) {
      out.append(s.data() + i, k);
      i += k;
    } else {
      out.append(kReplacementChar);
      i += k == 0 ? 1 : k;
    }
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  utf8_lossy_append(out, bytes);
  return out;
}

bool utf8_ends_incomplete(std::string_view s) {
  // Look back at most 3 bytes for the start of the last sequence.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    int need = 0;
    const size_t k = valid_prefix(s, i, need);
    return need > 0 && k == back && static_cast<int>(back) < need;
  }
  return false;
}

size_t utf8_char_count(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

}  // namespace atom::tokenizer
