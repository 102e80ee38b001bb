#include "server/py_literal.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <set>
#include <stdexcept>
#include <vector>

#include "jinja/lexer.h"

namespace atom::server {

namespace {

using json = nlohmann::ordered_json;

// Nesting beyond this is refused rather than recursed into (Python's own parser stops near 200).
constexpr int kMaxDepth = 200;

bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_ident(char c) { return is_ident_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}

  bool at_end() {
    skip_space();
    return i_ >= s_.size();
  }

  bool value(json& out, int depth) {
    if (depth > kMaxDepth) return false;
    skip_space();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '+' || c == '-') {
      ++i_;
      skip_space();
      // Only a number takes a sign (literal_eval's rule), and only one.
      if (i_ >= s_.size() ||
          !(is_digit(s_[i_]) || (s_[i_] == '.' && i_ + 1 < s_.size() && is_digit(s_[i_ + 1]))))
        return false;
      if (!number(out)) return false;
      if (c == '-') {
        if (out.is_number_integer()) {
          const int64_t v = out.get<int64_t>();
          out = -v;
        } else {
          out = -out.get<double>();
        }
      }
      return true;
    }
    if (is_digit(c) || (c == '.' && i_ + 1 < s_.size() && is_digit(s_[i_ + 1]))) return number(out);
    if (c == '[') return sequence(out, ']', depth);
    if (c == '(') return paren(out, depth);
    if (c == '{') return dict(out, depth);
    if (c == '\'' || c == '"' || is_ident_start(c)) return string_or_name(out);
    return false;
  }

  // name(key=value, ...)
  bool call(PyCall& out) {
    skip_space();
    if (!identifier(out.name)) return false;
    skip_space();
    if (!eat('(')) return false;
    out.arguments = json::object();
    std::set<std::string> seen;
    for (;;) {
      skip_space();
      if (eat(')')) return true;
      std::string key;
      if (!identifier(key) || key == "True" || key == "False" || key == "None") return false;
      skip_space();
      if (!eat('=') || (i_ < s_.size() && s_[i_] == '=')) return false;  // not `==`
      json v;
      if (!value(v, 1)) return false;
      if (!seen.insert(key).second) return false;  // Python: keyword argument repeated
      out.arguments[key] = std::move(v);
      skip_space();
      if (eat(')')) return true;
      if (!eat(',')) return false;
    }
  }

 private:
  void skip_space() {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f') {
        ++i_;
      } else if (c == '\\' && i_ + 1 < s_.size() && s_[i_ + 1] == '\n') {
        i_ += 2;  // line continuation
      } else if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else {
        return;
      }
    }
  }
  bool eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool identifier(std::string& out) {
    if (i_ >= s_.size() || !is_ident_start(s_[i_])) return false;
    const size_t a = i_;
    while (i_ < s_.size() && is_ident(s_[i_])) ++i_;
    out = std::string(s_.substr(a, i_ - a));
    return true;
  }

  // Digits with single underscores between them (Python's rule); returns them without.
  bool digits(std::string& out, bool (*ok)(char)) {
    bool any = false, last_underscore = false;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (ok(c)) {
        out += c;
        any = true;
        last_underscore = false;
      } else if (c == '_' && any && !last_underscore && i_ + 1 < s_.size() && ok(s_[i_ + 1])) {
        last_underscore = true;
      } else {
        break;
      }
      ++i_;
    }
    return any;
  }

  bool number(json& out) {
    const char c = s_[i_];
    if (c == '0' && i_ + 1 < s_.size() &&
        std::string("xXoObB").find(s_[i_ + 1]) != std::string::npos) {
      const char kind = static_cast<char>(s_[i_ + 1] | 0x20);
      i_ += 2;
      if (i_ < s_.size() && s_[i_] == '_') ++i_;  // 0x_ff is allowed
      std::string d;
      bool (*ok)(char) =
          kind == 'x' ? +[](char ch) { return std::isxdigit(static_cast<unsigned char>(ch)) != 0; }
          : kind == 'o' ? +[](char ch) { return ch >= '0' && ch <= '7'; }
                        : +[](char ch) { return ch == '0' || ch == '1'; };
      if (!digits(d, ok) || (i_ < s_.size() && is_ident(s_[i_]))) return false;
      errno = 0;
      const unsigned long long v = std::strtoull(d.c_str(), nullptr,
                                                 kind == 'x'   ? 16
                                                 : kind == 'o' ? 8
                                                               : 2);
      if (errno == ERANGE ||
          v > static_cast<unsigned long long>(std::numeric_limits<int64_t>::max()))
        return false;
      out = static_cast<int64_t>(v);
      return true;
    }
    std::string text, intpart;
    digits(intpart, is_digit);
    text = intpart;
    bool is_float = false;
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      is_float = true;
      text += '.';
      std::string frac;
      digits(frac, is_digit);
      text += frac;
      if (intpart.empty() && frac.empty()) return false;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      is_float = true;
      text += 'e';
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) text += s_[i_++];
      std::string exp;
      if (!digits(exp, is_digit)) return false;
      text += exp;
    }
    // A complex literal (1j), or letters glued on (1abc), is no literal here.
    if (i_ < s_.size() && (is_ident(s_[i_]) || s_[i_] == '.')) return false;
    if (!is_float) {
      // Python refuses leading zeros in a decimal integer other than 0 itself.
      if (intpart.size() > 1 && intpart[0] == '0' &&
          intpart.find_first_not_of('0') != std::string::npos)
        return false;
      errno = 0;
      const unsigned long long v = std::strtoull(intpart.c_str(), nullptr, 10);
      if (errno == ERANGE ||
          v > static_cast<unsigned long long>(std::numeric_limits<int64_t>::max()))
        return false;
      out = static_cast<int64_t>(v);
      return true;
    }
    const double d = std::strtod(text.c_str(), nullptr);
    if (!std::isfinite(d)) return false;  // json.dumps would write Infinity, which is no JSON
    out = d;
    return true;
  }

  bool sequence(json& out, char close, int depth) {
    ++i_;  // the opening bracket
    out = json::array();
    for (;;) {
      skip_space();
      if (eat(close)) return true;
      json v;
      if (!value(v, depth + 1)) return false;
      out.push_back(std::move(v));
      skip_space();
      if (eat(close)) return true;
      if (!eat(',')) return false;
    }
  }

  // (x) is x; (), (x,) and (x, y) are tuples.
  bool paren(json& out, int depth) {
    ++i_;
    skip_space();
    if (eat(')')) {
      out = json::array();
      return true;
    }
    json first;
    if (!value(first, depth + 1)) return false;
    skip_space();
    if (eat(')')) {
      out = std::move(first);
      return true;
    }
    if (!eat(',')) return false;
    out = json::array({std::move(first)});
    for (;;) {
      skip_space();
      if (eat(')')) return true;
      json v;
      if (!value(v, depth + 1)) return false;
      out.push_back(std::move(v));
      skip_space();
      if (eat(')')) return true;
      if (!eat(',')) return false;
    }
  }

  bool dict(json& out, int depth) {
    ++i_;
    out = json::object();
    for (;;) {
      skip_space();
      if (eat('}')) return true;
      json k;
      if (!value(k, depth + 1)) return false;
      // json.dumps writes these keys as strings; other keys (floats, tuples) are refused.
      std::string key;
      if (k.is_string()) {
        key = k.get<std::string>();
      } else if (k.is_boolean()) {
        key = k.get<bool>() ? "true" : "false";
      } else if (k.is_null()) {
        key = "null";
      } else if (k.is_number_integer()) {
        key = std::to_string(k.get<int64_t>());
      } else {
        return false;
      }
      skip_space();
      if (!eat(':')) return false;  // {a, b} is a set
      json v;
      if (!value(v, depth + 1)) return false;
      out[key] = std::move(v);  // a repeated key keeps its first place and its last value
      skip_space();
      if (eat('}')) return true;
      if (!eat(',')) return false;
    }
  }

  // A string (adjacent ones joined), or True/False/None.
  bool string_or_name(json& out) {
    std::string joined;
    bool any = false;
    for (;;) {
      skip_space();
      const size_t save = i_;
      bool raw = false;
      // String prefixes: r and u (either case, r in either order with u is not Python; keep it
      // simple: one letter). b and f prefixes make bytes and f-strings, which are refused.
      if (i_ < s_.size() && is_ident_start(s_[i_])) {
        const size_t a = i_;
        while (i_ < s_.size() && is_ident(s_[i_])) ++i_;
        const std::string_view word = s_.substr(a, i_ - a);
        if (i_ < s_.size() && (s_[i_] == '\'' || s_[i_] == '"') &&
            (word == "r" || word == "R" || word == "u" || word == "U")) {
          raw = word == "r" || word == "R";
        } else {
          i_ = save;
          if (any) break;
          if (word == "True")
            out = true;
          else if (word == "False")
            out = false;
          else if (word == "None")
            out = nullptr;
          else
            return false;
          i_ = a + word.size();
          return true;
        }
      }
      if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) {
        i_ = save;
        break;
      }
      if (!string_body(joined, raw)) return false;
      any = true;
    }
    if (!any) return false;
    out = std::move(joined);
    return true;
  }

  bool string_body(std::string& out, bool raw) {
    const char q = s_[i_];
    const bool triple = i_ + 2 < s_.size() && s_[i_ + 1] == q && s_[i_ + 2] == q;
    i_ += triple ? 3 : 1;
    // The literal's end: its closing quote(s), not one that a backslash escapes.
    const size_t begin = i_;
    size_t end = 0;
    for (;;) {
      if (i_ >= s_.size()) return false;
      const char c = s_[i_];
      if (c == q) {
        if (!triple) {
          end = i_++;
          break;
        }
        if (i_ + 2 < s_.size() && s_[i_ + 1] == q && s_[i_ + 2] == q) {
          end = i_;
          i_ += 3;
          break;
        }
        ++i_;
        continue;
      }
      if (c == '\n' && !triple) return false;
      if (c != '\\') {
        ++i_;
        continue;
      }
      if (i_ + 1 >= s_.size()) return false;
      i_ += 2;  // the escaped character does not end the string
    }
    const std::string_view body = s_.substr(begin, end - begin);
    if (raw) {  // backslashes stay, with what follows them
      out += body;
      return true;
    }
    try {
      out += jinja::decode_python_escapes(body, jinja::EscapeDialect::kPythonLiteral);
    } catch (const std::invalid_argument&) {
      return false;  // a truncated or unknown \x, \u, \U or \N escape, or a lone surrogate
    }
    return true;
  }

  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace

std::optional<nlohmann::ordered_json> py_literal_eval(std::string_view text) {
  Reader r(text);
  json v;
  if (!r.value(v, 0) || !r.at_end()) return std::nullopt;
  return v;
}

std::optional<PyCall> py_parse_call(std::string_view text) {
  Reader r(text);
  PyCall c;
  if (!r.call(c) || !r.at_end()) return std::nullopt;
  return c;
}

size_t py_scan_bracket(std::string_view t, PyScanState& st) {
  while (st.pos < t.size()) {
    const char c = t[st.pos];
    if (st.quote) {  // inside a string literal
      if (st.escaped) {
        st.escaped = false;
      } else if (c == '\\') {
        st.escaped = true;
      } else if (c == st.quote) {
        if (!st.triple) {
          st.quote = 0;
        } else if (st.pos + 2 >= t.size()) {
          return std::string::npos;  // a closing triple quote may be arriving
        } else if (t[st.pos + 1] == c && t[st.pos + 2] == c) {
          st.quote = 0;
          st.pos += 2;
        }
      }
      ++st.pos;
      continue;
    }
    if (c == '\'' || c == '"') {
      // One quote or three: undecided until three characters are there.
      if (st.pos + 2 >= t.size()) {
        if (st.pos + 1 >= t.size() || t[st.pos + 1] == c) return std::string::npos;
        st.triple = false;
      } else {
        st.triple = t[st.pos + 1] == c && t[st.pos + 2] == c;
      }
      st.quote = c;
      st.pos += st.triple ? 3 : 1;
      continue;
    }
    if (c == '(' || c == '[' || c == '{') {
      st.stack.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (st.stack.empty() || st.stack.back() != c) return kPyScanError;
      st.stack.pop_back();
      if (st.stack.empty()) return ++st.pos;
    } else if (c == '#') {  // a comment runs to the end of the line
      const size_t nl = t.find('\n', st.pos);
      if (nl == std::string::npos) return std::string::npos;  // resumes at the '#'
      st.pos = nl;
      continue;
    }
    if (st.stack.empty()) return kPyScanError;  // text[0] must open a bracket
    ++st.pos;
  }
  return std::string::npos;
}

size_t py_scan_bracket(std::string_view text) {
  PyScanState st;
  return py_scan_bracket(text, st);
}

}  // namespace atom::server
