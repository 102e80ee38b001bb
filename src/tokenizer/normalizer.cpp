#include "tokenizer/normalizer.h"

#include <vector>

#include "tokenizer/byte_level.h"
#include "tokenizer/replace.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace atom::tokenizer {

std::u32string json_chars(const Json& j, std::string_view key, std::string_view where) {
  const std::string s = json_string(j, key, where);
  std::u32string out;
  for (size_t i = 0; i < s.size();) out.push_back(utf8_next(s, i));
  return out;
}

namespace {

class UnicodeNorm final : public Normalizer {
 public:
  explicit UnicodeNorm(NormForm f) : form_(f) {}
  void normalize(std::string& s, bool&) const override { s = uni_normalize(s, form_); }

 private:
  NormForm form_;
};

class Lowercase final : public Normalizer {
 public:
  void normalize(std::string& s, bool&) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) uni_append_lowercase(out, utf8_next(s, i));
    s = std::move(out);
  }
};

// Strips characters with the White_Space property from either end.
class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s, bool& at_origin) const override {
    size_t begin = 0, end = s.size();
    if (left_) {
      while (begin < end) {
        size_t i = begin;
        if (!uni_is_whitespace(utf8_next(s, i))) break;
        begin = i;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        size_t i = start;
        if (!uni_is_whitespace(utf8_next(s, i))) break;
        end = start;
      }
    }
    if (begin > 0 && begin < end) at_origin = false;
    s = s.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

// Removes characters for which drop() is true and maps the rest through map().
template <typename Drop, typename Map>
void filter_map(std::string& s, bool& at_origin, Drop drop, Map map) {
  std::string out;
  out.reserve(s.size());
  bool kept_any = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = utf8_next(s, i);
    if (drop(c)) {
      if (!kept_any) at_origin = false;
      continue;
    }
    kept_any = true;
    utf8_append(out, map(c));
  }
  s = std::move(out);
}

class StripAccents final : public Normalizer {
 public:
  void normalize(std::string& s, bool& at_origin) const override {
    filter_map(
        s, at_origin, [](char32_t c) { return uni_is_combining_mark(c); },
        [](char32_t c) { return c; });
  }
};

class Nmt final : public Normalizer {
 public:
  void normalize(std::string& s, bool& at_origin) const override {
    filter_map(
        s, at_origin,
        [](char32_t c) {
          return (c >= 0x01 && c <= 0x08) || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F ||
                 c == 0x8F || c == 0x9F;
        },
        [](char32_t c) -> char32_t {
          switch (c) {
            case 0x09:
            case 0x0A:
            case 0x0C:
            case 0x0D:
            case 0x1680:
            case 0x2028:
            case 0x2029:
            case 0x2581:
            case 0xFEFF:
            case 0xFFFD:
              return ' ';
            default:
              return (c >= 0x200B && c <= 0x200F) ? ' ' : c;
          }
        });
  }
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string p) : prepend_(std::move(p)) {}
  void normalize(std::string& s, bool&) const override {
    if (!s.empty()) s = prepend_ + s;
  }

 private:
  std::string prepend_;
};

class ReplaceNorm final : public Normalizer {
 public:
  ReplaceNorm(const Json& j, const std::string& where) : replacer_(j, where) {}
  void normalize(std::string& s, bool& at_origin) const override {
    if (replacer_.apply(s)) at_origin = false;
  }

 private:
  Replacer replacer_;
};

class BertNorm final : public Normalizer {
 public:
  BertNorm(bool clean, bool chinese, bool strip_accents, bool lower)
      : clean_(clean), chinese_(chinese), strip_accents_(strip_accents), lower_(lower) {}
  void normalize(std::string& s, bool& at_origin) const override {
    if (clean_) {
      filter_map(
          s, at_origin, [](char32_t c) { return c == 0 || c == 0xFFFD || uni_is_control(c); },
          [](char32_t c) -> char32_t {
            return (c == '\t' || c == '\n' || c == '\r' || uni_is_whitespace(c)) ? U' ' : c;
          });
    }
    if (chinese_) {
      std::string out;
      for (size_t i = 0; i < s.size();) {
        const char32_t c = utf8_next(s, i);
        if (uni_is_chinese_char(c)) out.push_back(' ');
        utf8_append(out, c);
        if (uni_is_chinese_char(c)) out.push_back(' ');
      }
      s = std::move(out);
    }
    if (strip_accents_) {
      s = uni_normalize(s, NormForm::kNFD);
      filter_map(
          s, at_origin, [](char32_t c) { return uni_is_nonspacing_mark(c); },
          [](char32_t c) { return c; });
    }
    if (lower_) Lowercase().normalize(s, at_origin);
  }

 private:
  bool clean_, chinese_, strip_accents_, lower_;
};

class ByteLevelNorm final : public Normalizer {
 public:
  void normalize(std::string& s, bool&) const override {
    std::string out;
    byte_level_encode(s, out);
    s = std::move(out);
  }
};

class SequenceNorm final : public Normalizer {
 public:
  explicit SequenceNorm(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void normalize(std::string& s, bool& at_origin) const override {
    for (const auto& p : parts_) p->normalize(s, at_origin);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> normalizer_from_json(const Json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_type(j, where);
  if (type == "NFC") return std::make_unique<UnicodeNorm>(NormForm::kNFC);
  if (type == "NFD") return std::make_unique<UnicodeNorm>(NormForm::kNFD);
  if (type == "NFKC") return std::make_unique<UnicodeNorm>(NormForm::kNFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNorm>(NormForm::kNFKD);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Strip") {
    return std::make_unique<Strip>(json_bool(j, "strip_left", false, where),
                                   json_bool(j, "strip_right", false, where));
  }
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Nmt") return std::make_unique<Nmt>();
  if (type == "Prepend") return std::make_unique<Prepend>(json_string(j, "prepend", where));
  if (type == "Replace") return std::make_unique<ReplaceNorm>(j, where);
  if (type == "ByteLevel") return std::make_unique<ByteLevelNorm>();
  if (type == "BertNormalizer") {
    const bool lower = json_bool(j, "lowercase", true, where);
    bool strip = lower;
    if (auto it = j.find("strip_accents"); it != j.end() && !it->is_null())
      strip = json_bool(j, "strip_accents", lower, where);
    return std::make_unique<BertNorm>(json_bool(j, "clean_text", true, where),
                                      json_bool(j, "handle_chinese_chars", true, where), strip,
                                      lower);
  }
  if (type == "Sequence") {
    const Json& list = json_field(j, "normalizers", where);
    if (!list.is_array()) fail("{}.normalizers: expected an array", where);
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      auto n = normalizer_from_json(list[i], fmt::format("{}.normalizers[{}]", where, i));
      if (n) parts.push_back(std::move(n));
    }
    return std::make_unique<SequenceNorm>(std::move(parts));
  }
  fail(
      "{}: normalizer type \"{}\" is not supported by atom (supported: NFC, NFD, NFKC, NFKD, "
      "Lowercase, Strip, StripAccents, Nmt, Prepend, Replace, ByteLevel, BertNormalizer, Sequence)",
      where, type);
}

}  // namespace atom::tokenizer
