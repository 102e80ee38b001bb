#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace atom::tokenizer {

namespace {
utf8proc_category_t category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}
}  // namespace

bool uni_is_whitespace(char32_t c) {
  switch (c) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool uni_is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool uni_is_punctuation_or_ascii_punct(char32_t c) {
  if (c < 0x80) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
  }
  const auto cat = category(c);
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

bool uni_is_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  // Other_Alphabetic symbols (circled and squared Latin letters) that are not letters by category.
  if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
      (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189)) {
    return true;
  }
  const auto cat = category(c);
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_ME) ||
         cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_PC;
}

bool uni_is_combining_mark(char32_t c) {
  const auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME;
}

bool uni_is_nonspacing_mark(char32_t c) { return category(c) == UTF8PROC_CATEGORY_MN; }

bool uni_is_control(char32_t c) {
  // Bert's definition: \t \n \r count as whitespace, not control; any C* category is control.
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
         cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_CO;
}

bool uni_is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

void uni_append_lowercase(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
    return;
  }
  if (c == 0x130) {  // the one unconditional multi-char lowercase mapping (SpecialCasing.txt)
    out.append("i\xCC\x87");
    return;
  }
  utf8_append(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
}

namespace {

// True when code point c (>= 0x80) can never change under NFC nor combine with its neighbours, by
// utf8proc's data: no canonical decomposition, combining class 0, no part in any composition, not
// a Hangul jamo (those compose algorithmically).
bool nfc_inert(char32_t c) {
  if (c < 0x300) {
    const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(c));
    return p->comb_index == UINT16_MAX &&
           !(p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0);
  }
  if ((c >= 0x1100 && c <= 0x11FF) || (c >= 0xA960 && c <= 0xA97F) || (c >= 0xD7B0 && c <= 0xD7FF))
    return false;
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(c));
  if (p->combining_class != 0 || p->comb_index != UINT16_MAX) return false;
  return !(p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0);
}

std::string utf8proc_run(std::string_view s, int flags) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &out,
                                          static_cast<utf8proc_option_t>(flags));
  if (n < 0) fail("unicode normalization failed: {}", utf8proc_errmsg(n));
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

// NFC, running utf8proc only on the stretches that need it. No ASCII character composes with what
// precedes it, so NFC(s) is the concatenation of NFC over stretches that each begin at an ASCII
// character; a stretch whose other characters are all inert is already NFC.
std::string nfc(std::string_view s) {
  std::string out;
  size_t copied = 0;   // s[0, copied) is in out
  size_t seg = 0;      // start of the current stretch
  bool dirty = false;  // the current stretch has a character that is not inert
  auto flush = [&](size_t end) {
    if (dirty) {
      if (out.empty()) out.reserve(s.size() + 16);
      out.append(s.substr(copied, seg - copied));
      out.append(utf8proc_run(s.substr(seg, end - seg), UTF8PROC_STABLE | UTF8PROC_COMPOSE));
      copied = end;
    }
    dirty = false;
  };
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      // A stretch starts with its ASCII character: a combining mark after it may compose with it.
      flush(i);
      seg = i;
      ++i;
      continue;
    }
    if (!nfc_inert(utf8_next(s, i))) {
      // The whole stretch goes through utf8proc: skip to the next ASCII character.
      dirty = true;
      while (i < s.size() && static_cast<unsigned char>(s[i]) >= 0x80) ++i;
    }
  }
  flush(s.size());
  if (copied == 0) return std::string(s);
  out.append(s.substr(copied));
  return out;
}

}  // namespace

std::string uni_normalize(std::string_view s, NormForm form) {
  bool ascii = true;
  for (char ch : s) {
    if (static_cast<unsigned char>(ch) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii || s.empty()) return std::string(s);
  switch (form) {
    case NormForm::kNFC:
      return nfc(s);
    case NormForm::kNFD:
      return utf8proc_run(s, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    case NormForm::kNFKC:
      return utf8proc_run(s, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    case NormForm::kNFKD:
      return utf8proc_run(s, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  }
  return std::string(s);
}

}  // namespace atom::tokenizer
