#include "tokenizer/decoder.h"

#include "tokenizer/byte_level.h"
#include "tokenizer/replace.h"
#include "tokenizer/utf8.h"

namespace atom::tokenizer {

namespace {

// Maps every token made only of byte-level characters back to its bytes (other tokens, such as
// added tokens, keep their UTF-8 bytes) and repairs the joined bytes like from_utf8_lossy.
class ByteLevelDec final : public Decoder {
 public:
  bool is_byte_level() const override { return true; }
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    std::string tok_bytes;
    for (const std::string& t : tokens) {
      tok_bytes.clear();
      bool all = true;
      for (size_t i = 0; i < t.size() && all;) {
        const int b = byte_level_byte_of(utf8_next(t, i));
        if (b < 0) {
          all = false;
        } else {
          tok_bytes.push_back(static_cast<char>(b));
        }
      }
      bytes.append(all ? tok_bytes : t);
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

class MetaspaceDec final : public Decoder {
 public:
  MetaspaceDec(char32_t rep, bool prepend) : rep_(rep), prepend_(prepend) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      const std::string& t = tokens[k];
      std::string out;
      out.reserve(t.size());
      for (size_t i = 0; i < t.size();) {
        const size_t start = i;
        const char32_t c = utf8_next(t, i);
        if (c == rep_) {
          if (!(k == 0 && prepend_)) out.push_back(' ');
        } else {
          out.append(t, start, i - start);
        }
      }
      tokens[k] = std::move(out);
    }
  }

 private:
  char32_t rep_;
  bool prepend_;
};

class ReplaceDec final : public Decoder {
 public:
  ReplaceDec(const Json& j, const std::string& where) : r_(j, where) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) r_.apply(t);
  }

 private:
  Replacer r_;
};

// Runs of "<0xNN>" tokens become the UTF-8 text they spell; an invalid run becomes one U+FFFD
// per byte (HF's rule, not from_utf8_lossy's).
class ByteFallbackDec final : public Decoder {
 public:
  bool has_byte_fallback() const override { return true; }
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    auto flush = [&] {
      if (run.empty()) return;
      if (utf8_is_valid(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run.size(); ++i) out.emplace_back(kReplacementChar);
      }
      run.clear();
    };
    for (auto& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>')
        byte = parse_hex2(t[3], t[4]);
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int parse_hex2(char a, char b) {
    const int h = hex(a), l = hex(b);
    return (h < 0 || l < 0) ? -1 : h * 16 + l;
  }
};

class FuseDec final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from each token.
class StripDec final : public Decoder {
 public:
  StripDec(char32_t c, size_t start, size_t stop) : c_(c), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::u32string chars;
      for (size_t i = 0; i < t.size();) chars.push_back(utf8_next(t, i));
      size_t begin = 0;
      for (size_t i = 0; i < start_ && i < chars.size() && chars[i] == c_; ++i) begin = i + 1;
      size_t end = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size(); ++i) {
        const size_t idx = chars.size() - i - 1;
        if (chars[idx] != c_) break;
        end = idx;
      }
      std::string out;
      for (size_t i = begin; i < end; ++i) utf8_append(out, chars[i]);
      t = std::move(out);
    }
  }

 private:
  char32_t c_;
  size_t start_, stop_;
};

class BpeDec final : public Decoder {
 public:
  explicit BpeDec(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (suffix_.empty()) return;
    for (size_t k = 0; k < tokens.size(); ++k) {
      const std::string rep = k + 1 == tokens.size() ? "" : " ";
      std::string& t = tokens[k];
      std::string out;
      size_t pos = 0;
      for (size_t m = t.find(suffix_); m != std::string::npos; m = t.find(suffix_, pos)) {
        out.append(t, pos, m - pos).append(rep);
        pos = m + suffix_.size();
      }
      out.append(t, pos, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

class WordPieceDec final : public Decoder {
 public:
  WordPieceDec(std::string prefix, bool cleanup) : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string& t = tokens[k];
      if (k != 0) {
        if (t.compare(0, prefix_.size(), prefix_) == 0) {
          t.erase(0, prefix_.size());
        } else {
          t = std::string(" ") + t;
        }
      }
      if (cleanup_) {
        static const std::pair<const char*, const char*> kRules[] = {
            {" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
            {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
            {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
        for (const auto& [from, to] : kRules) {
          const std::string_view f(from);
          std::string out;
          size_t pos = 0;
          for (size_t m = t.find(f); m != std::string::npos; m = t.find(f, pos)) {
            out.append(t, pos, m - pos).append(to);
            pos = m + f.size();
          }
          out.append(t, pos, std::string::npos);
          t = std::move(out);
        }
      }
    }
  }

 private:
  std::string prefix_;
  bool cleanup_;
};

class SequenceDec final : public Decoder {
 public:
  explicit SequenceDec(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }
  bool has_byte_fallback() const override {
    for (const auto& p : parts_) {
      if (p->has_byte_fallback()) return true;
    }
    return false;
  }
  bool is_byte_level() const override {
    for (const auto& p : parts_) {
      if (p->is_byte_level()) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

bool hex_digit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

char32_t single_char(const Json& j, const char* key, const std::string& where) {
  const std::u32string s = json_chars(j, key, where);
  if (s.size() != 1) fail("{}.{}: expected a single character", where, key);
  return s[0];
}

}  // namespace

bool is_byte_fallback_token(std::string_view t) {
  return t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && hex_digit(t[3]) &&
         hex_digit(t[4]);
}

std::unique_ptr<Decoder> decoder_from_json(const Json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_type(j, where);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDec>();
  if (type == "Metaspace") {
    bool prepend = true;
    if (auto ps = json_opt_string(j, "prepend_scheme", where)) prepend = *ps != "never";
    if (j.contains("add_prefix_space") && !json_bool(j, "add_prefix_space", true, where))
      prepend = false;
    return std::make_unique<MetaspaceDec>(single_char(j, "replacement", where), prepend);
  }
  if (type == "Replace") return std::make_unique<ReplaceDec>(j, where);
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDec>();
  if (type == "Fuse") return std::make_unique<FuseDec>();
  if (type == "Strip") {
    return std::make_unique<StripDec>(single_char(j, "content", where),
                                      static_cast<size_t>(json_int(j, "start", where)),
                                      static_cast<size_t>(json_int(j, "stop", where)));
  }
  if (type == "BPEDecoder") {
    return std::make_unique<BpeDec>(json_opt_string(j, "suffix", where).value_or("</w>"));
  }
  if (type == "WordPiece") {
    return std::make_unique<WordPieceDec>(json_opt_string(j, "prefix", where).value_or("##"),
                                          json_bool(j, "cleanup", true, where));
  }
  if (type == "Sequence") {
    const Json& list = json_field(j, "decoders", where);
    if (!list.is_array()) fail("{}.decoders: expected an array", where);
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      auto d = decoder_from_json(list[i], fmt::format("{}.decoders[{}]", where, i));
      if (d) parts.push_back(std::move(d));
    }
    return std::make_unique<SequenceDec>(std::move(parts));
  }
  fail(
      "{}: decoder type \"{}\" is not supported by atom (supported: ByteLevel, Metaspace, Replace, "
      "ByteFallback, Fuse, Strip, BPEDecoder, WordPiece, Sequence)",
      where, type);
}

}  // namespace atom::tokenizer
