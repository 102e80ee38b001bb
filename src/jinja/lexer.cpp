#include "jinja/lexer.h"

#include <cmath>
#include <stdexcept>

#include "jinja/error.h"
#include "jinja/unicode.h"

namespace atom::jinja {

namespace {

[[noreturn]] void syntax_fail(const std::string& where, int line, std::string msg) {
  throw TemplateError(TemplateError::Kind::kSyntax, std::move(msg), where, line);
}

// Python's \s (str patterns) at byte i; returns the byte length matched, 0 if none.
size_t space_at(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  size_t j = i;
  char32_t c = unicode::decode(s, j);
  return unicode::is_space(c) ? j - i : 0;
}

size_t skip_spaces(std::string_view s, size_t i) {
  while (size_t n = space_at(s, i)) i += n;
  return i;
}

bool starts_with(std::string_view s, size_t i, std::string_view p) {
  return s.substr(i, p.size()) == p;
}

std::string rstrip_ws(std::string_view s) { return unicode::strip(s, nullptr, false, true); }

// True when s is one or more whitespace characters (jinja2's whitespace_re.fullmatch).
bool all_space(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();) {
    size_t n = space_at(s, i);
    if (!n) return false;
    i += n;
  }
  return true;
}

int count_newlines(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); }

// Digits with optional single underscores between them ((\d+_)*\d+); returns the end or start.
size_t match_digits(std::string_view s, size_t i) {
  size_t j = i;
  if (j >= s.size() || !is_digit(s[j])) return i;
  while (true) {
    while (j < s.size() && is_digit(s[j])) ++j;
    if (j + 1 < s.size() && s[j] == '_' && is_digit(s[j + 1])) {
      ++j;
      continue;
    }
    return j;
  }
}

size_t match_float(std::string_view s, size_t i) {
  if (i > 0 && s[i - 1] == '.') return i;
  size_t j = match_digits(s, i);
  if (j == i) return i;
  size_t frac = j;
  if (j < s.size() && s[j] == '.') {
    size_t k = match_digits(s, j + 1);
    if (k > j + 1) frac = k;
  }
  size_t e = frac;
  if (e < s.size() && (s[e] | 0x20) == 'e') {
    size_t k = e + 1;
    if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
    size_t m = match_digits(s, k);
    if (m > k) return m;
  }
  return frac > j ? frac : i;
}

size_t match_integer(std::string_view s, size_t i) {
  if (i >= s.size() || !is_digit(s[i])) return i;
  auto prefixed = [&](char p, auto ok) -> size_t {
    if (s[i] != '0' || i + 1 >= s.size() || (s[i + 1] | 0x20) != p) return i;
    size_t j = i + 2, last = i;
    while (true) {
      size_t k = j;
      if (k < s.size() && s[k] == '_') ++k;
      if (k < s.size() && ok(s[k])) {
        j = k + 1;
        last = j;
      } else {
        break;
      }
    }
    return last;
  };
  for (auto [p, ok] :
       {std::pair<char, bool (*)(char)>{'b', [](char c) { return c == '0' || c == '1'; }},
        {'o', [](char c) { return c >= '0' && c <= '7'; }},
        {'x', [](char c) { return is_hex(c); }}}) {
    size_t j = prefixed(p, ok);
    if (j > i) return j;
  }
  char first = s[i];
  size_t j = i + 1;
  while (true) {
    size_t k = j;
    if (k < s.size() && s[k] == '_') ++k;
    if (k < s.size() && is_digit(s[k]) && (first != '0' || s[k] == '0')) {
      j = k + 1;
    } else {
      return j;
    }
  }
}

bool name_char(std::string_view s, size_t i, size_t* len) {
  size_t j = i;
  char32_t c = unicode::decode(s, j);
  *len = j - i;
  if (c < 0x80)
    return c == '_' || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
  return unicode::is_word(c) || (c >= 0x300 && c <= 0x36F);
}

int64_t parse_int_literal(std::string text, const std::string& where, int line) {
  std::string digits;
  for (char c : text) {
    if (c != '_') digits += c;
  }
  int base = 10;
  size_t start = 0;
  if (digits.size() > 2 && digits[0] == '0') {
    char p = static_cast<char>(digits[1] | 0x20);
    base = p == 'b' ? 2 : p == 'o' ? 8 : p == 'x' ? 16 : 10;
    if (base != 10) start = 2;
  }
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(digits.c_str() + start, &end, base);
  if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX)) {
    syntax_fail(where, line,
                "integer literal " + text + " is too large (atom uses 64-bit integers)");
  }
  return static_cast<int64_t>(v);
}

const char* const kOperators[] = {"**", "//", "==", "!=", ">=", "<=", "+", "-", "/",
                                  "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                  ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};

class Lexer {
 public:
  Lexer(std::string_view source, const LexerOptions& o, const std::string& where)
      : opt_(o), where_(where) {
    // jinja2 normalises every line ending to \n and drops one trailing newline.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!opt_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    std::string_view s = src_;
    while (pos_ < s.size()) {
      size_t idx = find_tag(pos_);
      if (idx == std::string_view::npos) {
        emit_data(s.substr(pos_));
        advance_to(s.size());
        break;
      }
      char kind = s[idx + 1];
      char sign = idx + 2 < s.size() && (s[idx + 2] == '-' || s[idx + 2] == '+') ? s[idx + 2] : 0;
      size_t raw_end = kind == '%' ? match_raw_begin(idx) : 0;
      emit_data(strip_before(s.substr(pos_, idx - pos_), sign, kind != '{'));
      advance_to(idx);
      if (raw_end) {
        line_starting_ = s[raw_end - 1] == '\n';
        advance_to(raw_end);
        lex_raw();
        continue;
      }
      size_t body = idx + 2 + (sign ? 1 : 0);
      line_starting_ = false;
      if (kind == '#') {
        lex_comment(body);
      } else {
        push(kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "");
        advance_to(body);
        lex_tag(kind == '{');
      }
    }
    push(Tok::kEof, "");
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  // {%[-+]?\s*raw\s*(-%}\s*|%}): returns the end of the match or 0.
  size_t match_raw_begin(size_t idx) const {
    std::string_view s = src_;
    size_t i = idx + 2;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    i = skip_spaces(s, i);
    if (!starts_with(s, i, "raw")) return 0;
    i = skip_spaces(s, i + 3);
    if (starts_with(s, i, "-%}")) return skip_spaces(s, i + 3);
    if (starts_with(s, i, "%}")) return i + 2;
    return 0;
  }

  // The text before a tag loses trailing whitespace with `-`, or its indentation with
  // lstrip_blocks when the tag starts the line (jinja2's OptionalLStrip).
  std::string strip_before(std::string_view text, char sign, bool lstrip_applies) const {
    if (sign == '-') return rstrip_ws(text);
    if (sign != '+' && opt_.lstrip_blocks && lstrip_applies) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && all_space(text.substr(l_pos))) {
        return std::string(text.substr(0, l_pos));
      }
    }
    return std::string(text);
  }

  // Block and comment ends: `+%}` keeps what follows, `-%}` eats following whitespace, a plain
  // `%}` eats one newline under trim_blocks. Returns the end of the match, or 0.
  size_t match_block_end(size_t i, char c) const {
    std::string_view s = src_;
    std::string close = std::string(1, c) + "}";
    if (s[i] == '+' && starts_with(s, i + 1, close)) return i + 3;
    if (s[i] == '-' && starts_with(s, i + 1, close)) return skip_spaces(s, i + 3);
    if (starts_with(s, i, close)) {
      size_t j = i + 2;
      if (opt_.trim_blocks && j < s.size() && s[j] == '\n') ++j;
      return j;
    }
    return 0;
  }

  void lex_comment(size_t body) {
    for (size_t i = body; i < src_.size(); ++i) {
      if (size_t end = match_block_end(i, '#')) {
        line_starting_ = src_[end - 1] == '\n';
        advance_to(end);
        return;
      }
    }
    syntax_fail(where_, line_, "Missing end of comment tag");
  }

  void lex_raw() {
    std::string_view s = src_;
    for (size_t i = s.find("{%", pos_); i != std::string_view::npos; i = s.find("{%", i + 1)) {
      size_t j = i + 2;
      char sign = j < s.size() && (s[j] == '-' || s[j] == '+') ? s[j] : 0;
      if (sign) ++j;
      j = skip_spaces(s, j);
      if (!starts_with(s, j, "endraw")) continue;
      j = skip_spaces(s, j + 6);
      size_t end = j < s.size() ? match_block_end(j, '%') : 0;
      if (!end) continue;
      emit_data(strip_before(s.substr(pos_, i - pos_), sign, true));
      line_starting_ = s[end - 1] == '\n';
      advance_to(end);
      return;
    }
    syntax_fail(where_, line_, "Missing end of raw directive");
  }

  void lex_tag(bool variable) {
    std::string_view s = src_;
    std::vector<char> balance;
    while (true) {
      if (pos_ >= s.size()) return;  // the parser reports the unterminated tag
      if (balance.empty()) {
        size_t end = 0;
        if (variable) {
          if (s[pos_] == '-' && starts_with(s, pos_ + 1, "}}"))
            end = skip_spaces(s, pos_ + 3);
          else if (starts_with(s, pos_, "}}"))
            end = pos_ + 2;
        } else {
          end = match_block_end(pos_, '%');
        }
        if (end) {
          push(variable ? Tok::kVarEnd : Tok::kBlockEnd, "");
          line_starting_ = s[end - 1] == '\n';
          advance_to(end);
          return;
        }
      }
      if (size_t n = space_at(s, pos_)) {
        advance_to(skip_spaces(s, pos_ + n));
        continue;
      }
      size_t end = match_float(s, pos_);
      if (end > pos_) {
        std::string text(s.substr(pos_, end - pos_));
        std::string clean;
        for (char c : text) {
          if (c != '_') clean += c;
        }
        Token& t = push(Tok::kFloat, text);
        t.fval = std::strtod(clean.c_str(), nullptr);
        advance_to(end);
        continue;
      }
      end = match_integer(s, pos_);
      if (end > pos_) {
        std::string text(s.substr(pos_, end - pos_));
        Token& t = push(Tok::kInteger, text);
        t.ival = parse_int_literal(text, where_, line_);
        advance_to(end);
        continue;
      }
      size_t len = 0;
      if (name_char(s, pos_, &len)) {
        end = pos_;
        while (end < s.size() && name_char(s, end, &len)) end += len;
        push(Tok::kName, std::string(s.substr(pos_, end - pos_)));
        advance_to(end);
        continue;
      }
      if (s[pos_] == '\'' || s[pos_] == '"') {
        lex_string();
        continue;
      }
      bool matched = false;
      for (const char* op : kOperators) {
        std::string_view o(op);
        if (!starts_with(s, pos_, o)) continue;
        if (o == "{" || o == "(" || o == "[") {
          balance.push_back(o == "{" ? '}' : o == "(" ? ')' : ']');
        } else if (o == "}" || o == ")" || o == "]") {
          if (balance.empty()) syntax_fail(where_, line_, fmt::format("unexpected '{}'", o));
          char expected = balance.back();
          balance.pop_back();
          if (expected != o[0]) {
            syntax_fail(where_, line_, fmt::format("unexpected '{}', expected '{}'", o, expected));
          }
        }
        push(Tok::kOperator, std::string(o));
        advance_to(pos_ + o.size());
        matched = true;
        break;
      }
      if (!matched) {
        size_t j = pos_;
        std::string ch;
        unicode::append(ch, unicode::decode(s, j));
        syntax_fail(where_, line_,
                    fmt::format("unexpected char {} at {}", string_repr_char(ch), pos_));
      }
    }
  }

  static std::string string_repr_char(const std::string& ch) { return "'" + ch + "'"; }

  void lex_string() {
    std::string_view s = src_;
    char q = s[pos_];
    size_t i = pos_ + 1;
    while (i < s.size() && s[i] != q) i += s[i] == '\\' ? 2 : 1;
    if (i >= s.size()) {
      syntax_fail(where_, line_, fmt::format("unexpected char '{}' at {}", q, pos_));
    }
    try {
      push(Tok::kString, decode_python_escapes(s.substr(pos_ + 1, i - pos_ - 1)));
    } catch (const std::invalid_argument& e) {
      syntax_fail(where_, line_, e.what());
    }
    advance_to(i + 1);
  }

  void emit_data(std::string_view text) {
    if (!text.empty()) push(Tok::kData, std::string(text));
  }

  Token& push(Tok type, std::string text) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.line = line_;
    tokens_.push_back(std::move(t));
    return tokens_.back();
  }

  void advance_to(size_t p) {
    line_ += count_newlines(std::string_view(src_).substr(pos_, p - pos_));
    pos_ = p;
  }

  LexerOptions opt_;
  const std::string& where_;
  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

void append_backslashreplace(std::string& out, char32_t c) {
  if (c < 0x100)
    out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
  else if (c < 0x10000)
    out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
  else
    out += fmt::format("\\U{:08x}", static_cast<unsigned>(c));
}

}  // namespace

std::string decode_python_escapes(std::string_view s, EscapeDialect dialect) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s[i] != '\\') {
      size_t start = i;
      unicode::decode(s, i);
      out.append(s.substr(start, i - start));
      continue;
    }
    if (i + 1 >= s.size()) throw std::invalid_argument("\\ at end of string");
    char c = s[i + 1];
    i += 2;
    auto hex = [&](int n, const char* what) {
      uint32_t v = 0;
      for (int k = 0; k < n; ++k) {
        if (i + k >= s.size() || !is_hex(s[i + k])) {
          throw std::invalid_argument(std::string("truncated ") + what + " escape");
        }
        char h = s[i + k];
        v = v * 16 + static_cast<uint32_t>(is_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      i += static_cast<size_t>(n);
      if (v > 0x10FFFF) throw std::invalid_argument("illegal Unicode character");
      if (v >= 0xD800 && v <= 0xDFFF && dialect == EscapeDialect::kPythonLiteral)
        throw std::invalid_argument("lone surrogate");
      unicode::append(out, v);
    };
    switch (c) {
      case '\n':
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
        hex(2, "\\xXX");
        break;
      case 'u':
        hex(4, "\\uXXXX");
        break;
      case 'U':
        hex(8, "\\UXXXXXXXX");
        break;
      case 'N':
        throw std::invalid_argument("\\N{...} escapes are not supported");
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = static_cast<uint32_t>(c - '0');
          for (int k = 0; k < 2 && i < s.size() && s[i] >= '0' && s[i] <= '7'; ++k, ++i) {
            v = v * 8 + static_cast<uint32_t>(s[i] - '0');
          }
          unicode::append(out, v);
        } else if (static_cast<unsigned char>(c) >= 0x80 && dialect == EscapeDialect::kJinja) {
          // Python escapes non-ASCII text with backslashreplace before decoding, so a backslash
          // in front of it survives together with that escape's text.
          size_t j = i - 1;
          char32_t cp = unicode::decode(s, j);
          i = j;
          append_backslashreplace(out, cp);
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

std::string describe_token(const Token& t) {
  switch (t.type) {
    case Tok::kData:
      return "template data";
    case Tok::kVarBegin:
      return "begin of print statement";
    case Tok::kVarEnd:
      return "end of print statement";
    case Tok::kBlockBegin:
      return "begin of statement block";
    case Tok::kBlockEnd:
      return "end of statement block";
    case Tok::kName:
      return "'" + t.text + "'";
    case Tok::kString:
      return "string";
    case Tok::kInteger:
      return "integer";
    case Tok::kFloat:
      return "float";
    case Tok::kOperator:
      return "'" + t.text + "'";
    case Tok::kEof:
      return "end of template";
  }
  return "token";
}

std::vector<Token> tokenize(std::string_view source, const LexerOptions& options,
                            const std::string& where) {
  return Lexer(source, options, where).run();
}

}  // namespace atom::jinja
