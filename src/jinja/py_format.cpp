#include "jinja/py_format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "jinja/interpreter.h"
#include "jinja/py_ops.h"
#include "jinja/unicode.h"

namespace atom::jinja {

namespace {

std::string pad(std::string body, size_t width, char align, char32_t fill) {
  size_t len = unicode::length(body);
  if (len >= width) return body;
  size_t n = width - len;
  std::string f;
  unicode::append(f, fill);
  auto fills = [&](size_t k) {
    std::string s;
    for (size_t i = 0; i < k; ++i) s += f;
    return s;
  };
  if (align == '<') return body + fills(n);
  if (align == '^') return fills(n / 2) + body + fills(n - n / 2);
  return fills(n) + body;
}

std::string ascii_repr(const Value& v) {
  std::string r = repr(v), out;
  for (size_t i = 0; i < r.size();) {
    char32_t c = unicode::decode(r, i);
    if (c < 0x80)
      out += static_cast<char>(c);
    else if (c < 0x100)
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
    else if (c < 0x10000)
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    else
      out += fmt::format("\\U{:08x}", static_cast<unsigned>(c));
  }
  return out;
}

std::string c_format_double(const std::string& flags, int width, int prec, char type, double d) {
  std::string f = "%" + flags;
  if (width > 0) f += std::to_string(width);
  f += "." + std::to_string(prec) + type;
  int n = std::snprintf(nullptr, 0, f.c_str(), d);
  std::string out(static_cast<size_t>(n), '\0');
  std::snprintf(out.data(), out.size() + 1, f.c_str(), d);
  return out;
}

std::string int_digits(uint64_t mag, char type) {
  if (mag == 0) return "0";
  std::string s;
  int base = type == 'x' || type == 'X' ? 16 : type == 'o' ? 8 : type == 'b' ? 2 : 10;
  const char* digits = type == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
  while (mag) {
    s += digits[mag % static_cast<uint64_t>(base)];
    mag /= static_cast<uint64_t>(base);
  }
  std::reverse(s.begin(), s.end());
  return s;
}

}  // namespace

std::string percent_format(const std::string& fmt, const Value& args) {
  bool is_mapping = args.is_dict();
  std::vector<Value> seq;
  if (args.is_tuple())
    seq = args.list().items;
  else
    seq.push_back(args);
  size_t argi = 0;
  auto next_arg = [&]() -> Value {
    if (argi >= seq.size()) eval_fail("not enough arguments for format string");
    return seq[argi++];
  };
  std::string out;
  for (size_t i = 0; i < fmt.size();) {
    if (fmt[i] != '%') {
      out += fmt[i++];
      continue;
    }
    ++i;
    if (i >= fmt.size()) eval_fail("incomplete format");
    std::optional<Value> keyed;
    if (fmt[i] == '(') {
      if (!is_mapping) eval_fail("format requires a mapping");
      int depth = 1;
      size_t start = ++i;
      while (i < fmt.size() && depth) {
        depth += fmt[i] == '(' ? 1 : fmt[i] == ')' ? -1 : 0;
        ++i;
      }
      if (depth) eval_fail("incomplete format key");
      std::string key = fmt.substr(start, i - 1 - start);
      const Value* v = args.dict().find(std::string_view(key));
      if (!v) eval_fail("KeyError: {}", string_repr(key));
      keyed = *v;
    }
    std::string flags;
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) {
      if (flags.find(fmt[i]) == std::string::npos) flags += fmt[i];
      ++i;
    }
    int width = 0;
    if (i < fmt.size() && fmt[i] == '*') {
      width = static_cast<int>(to_index(next_arg(), "* wants int"));
      if (width < 0) {
        flags += '-';
        width = -width;
      }
      ++i;
    } else {
      while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9')
        width = width * 10 + (fmt[i++] - '0');
    }
    int prec = -1;
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      prec = 0;
      if (i < fmt.size() && fmt[i] == '*') {
        prec = static_cast<int>(to_index(next_arg(), "* wants int"));
        ++i;
      } else {
        while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9')
          prec = prec * 10 + (fmt[i++] - '0');
      }
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) eval_fail("incomplete format");
    char type = fmt[i++];
    if (type == '%') {
      out += '%';
      continue;
    }
    Value v = keyed ? *keyed : next_arg();
    bool left = flags.find('-') != std::string::npos;
    bool zero = flags.find('0') != std::string::npos && !left;
    std::string sign_flag = flags.find('+') != std::string::npos   ? "+"
                            : flags.find(' ') != std::string::npos ? " "
                                                                   : "";
    std::string body;
    switch (type) {
      case 's':
      case 'r':
      case 'a': {
        body = type == 's' ? to_str(v) : type == 'r' ? repr(v) : ascii_repr(v);
        if (prec >= 0) body = body.substr(0, unicode::byte_offset(body, static_cast<size_t>(prec)));
        out += pad(body, static_cast<size_t>(width), left ? '<' : '>', ' ');
        continue;
      }
      case 'c': {
        if (v.is_string() && unicode::length(v.str()) == 1)
          body = v.str();
        else if (v.is_integral())
          unicode::append(body, static_cast<char32_t>(v.as_int()));
        else
          eval_fail("%c requires int or char");
        out += pad(body, static_cast<size_t>(width), left ? '<' : '>', ' ');
        continue;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o': {
        int64_t n;
        if (v.is_integral()) {
          n = v.as_int();
        } else if (v.is_float() && (type == 'd' || type == 'i' || type == 'u')) {
          double d = v.as_double();
          if (!std::isfinite(d)) eval_fail("cannot convert float {} to integer", float_repr(d));
          n = static_cast<int64_t>(std::trunc(d));
        } else if (type == 'd' || type == 'i' || type == 'u') {
          eval_fail("%{} format: a real number is required, not {}", type, type_name(v));
        } else {
          eval_fail("%{} format: an integer is required, not {}", type, type_name(v));
        }
        uint64_t mag = n < 0 ? uint64_t(0) - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
        char t = type == 'i' || type == 'u' ? 'd' : type;
        std::string digits = int_digits(mag, t);
        if (prec >= 0 && digits.size() < static_cast<size_t>(prec)) {
          digits.insert(0, static_cast<size_t>(prec) - digits.size(), '0');
        }
        std::string prefix = n < 0 ? "-" : sign_flag;
        if (flags.find('#') != std::string::npos) {
          if (t == 'x') prefix += "0x";
          if (t == 'X') prefix += "0X";
          if (t == 'o') prefix += "0o";
        }
        if (zero && prefix.size() + digits.size() < static_cast<size_t>(width)) {
          digits.insert(0, static_cast<size_t>(width) - prefix.size() - digits.size(), '0');
        }
        out += pad(prefix + digits, static_cast<size_t>(width), left ? '<' : '>', ' ');
        continue;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        if (!v.is_number()) eval_fail("must be real number, not {}", type_name(v));
        std::string cflags = flags;
        out += c_format_double(cflags, width, prec < 0 ? 6 : prec, type, v.as_double());
        continue;
      }
      default:
        eval_fail("unsupported format character '{}' (0x{:x}) at index {}", type,
                  static_cast<unsigned>(static_cast<unsigned char>(type)), i - 1);
    }
  }
  if (!is_mapping && argi < seq.size()) {
    eval_fail("not all arguments converted during string formatting");
  }
  return out;
}

std::string format_spec(const Value& v, const std::string& spec) {
  if (spec.empty()) return to_str(v);
  // [[fill]align][sign][#][0][width][grouping][.precision][type]
  size_t i = 0;
  char32_t fill = ' ';
  char align = 0;
  {
    size_t j = 0;
    char32_t c0 = unicode::decode(spec, j);
    if (j < spec.size() && std::string_view("<>=^").find(spec[j]) != std::string_view::npos) {
      fill = c0;
      align = spec[j];
      i = j + 1;
    } else if (std::string_view("<>=^").find(spec[0]) != std::string_view::npos) {
      align = spec[0];
      i = 1;
    }
  }
  char sign = '-';
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) sign = spec[i++];
  bool alt = false;
  if (i < spec.size() && spec[i] == '#') {
    alt = true;
    ++i;
  }
  if (i < spec.size() && spec[i] == '0') {
    if (!align) {
      fill = '0';
      align = '=';
    }
    ++i;
  }
  size_t width = 0;
  while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9')
    width = width * 10 + static_cast<size_t>(spec[i++] - '0');
  char grouping = 0;
  if (i < spec.size() && (spec[i] == ',' || spec[i] == '_')) grouping = spec[i++];
  int prec = -1;
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    prec = 0;
    while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9')
      prec = prec * 10 + (spec[i++] - '0');
  }
  char type = 0;
  if (i < spec.size()) type = spec[i++];
  if (i != spec.size())
    eval_fail("Invalid format specifier '{}' for object of type '{}'", spec, type_name(v));

  if (v.is_string() || (!v.is_number())) {
    if (!v.is_string()) {
      eval_fail("unsupported format string passed to {}.__format__", type_name(v));
    }
    if (type && type != 's') eval_fail("Unknown format code '{}' for object of type 'str'", type);
    if (sign != '-' || alt || grouping || align == '=')
      eval_fail("invalid format spec for str: '{}'", spec);
    std::string body = v.str();
    if (prec >= 0) body = body.substr(0, unicode::byte_offset(body, static_cast<size_t>(prec)));
    return pad(body, width, align ? align : '<', fill);
  }

  bool is_int_type = type == 0 || type == 'd' || type == 'b' || type == 'o' || type == 'x' ||
                     type == 'X' || type == 'c' || type == 'n';
  std::string body, prefix;
  if (v.is_integral() && is_int_type && !(type == 0 && prec >= 0)) {
    if (prec >= 0) eval_fail("Precision not allowed in integer format specifier");
    int64_t n = v.as_int();
    if (type == 'c') {
      unicode::append(body, static_cast<char32_t>(n));
    } else {
      uint64_t mag = n < 0 ? uint64_t(0) - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
      char t = type == 0 || type == 'n' ? 'd' : type;
      body = int_digits(mag, t);
      if (grouping) {
        size_t group = t == 'd' ? 3 : 4;
        std::string g;
        for (size_t k = 0; k < body.size(); ++k) {
          if (k && (body.size() - k) % group == 0) g += grouping;
          g += body[k];
        }
        body = g;
      }
      prefix = n < 0 ? "-" : sign == '+' ? "+" : sign == ' ' ? " " : "";
      if (alt && (t == 'x' || t == 'X' || t == 'o' || t == 'b')) prefix += std::string("0") + t;
    }
  } else {
    if (type && std::string_view("eEfFgG%").find(type) == std::string_view::npos) {
      eval_fail("Unknown format code '{}' for object of type '{}'", type, type_name(v));
    }
    double d = v.as_double();
    double mag = std::fabs(d);
    if (type == 0 && prec < 0) {
      body = v.is_float() ? float_repr(mag) : std::to_string(std::llabs(v.as_int()));
    } else if (type == 0) {
      body = c_format_double(alt ? "#" : "", 0, prec == 0 ? 1 : prec, 'g', mag);
      if (body.find_first_of(".en") == std::string::npos) body += ".0";
    } else if (type == '%') {
      body = c_format_double(alt ? "#" : "", 0, prec < 0 ? 6 : prec, 'f', mag * 100) + "%";
    } else {
      body = c_format_double(alt ? "#" : "", 0, prec < 0 ? 6 : prec, type, mag);
    }
    if (grouping) {
      size_t dot = body.find_first_of(".eE%");
      std::string ip = body.substr(0, dot), rest = dot == std::string::npos ? "" : body.substr(dot);
      std::string g;
      for (size_t k = 0; k < ip.size(); ++k) {
        if (k && (ip.size() - k) % 3 == 0) g += grouping;
        g += ip[k];
      }
      body = g + rest;
    }
    prefix = std::signbit(d) && !std::isnan(d) ? "-" : sign == '+' ? "+" : sign == ' ' ? " " : "";
  }
  if (align == '=') {
    size_t len = unicode::length(prefix) + unicode::length(body);
    std::string f;
    for (size_t k = len; k < width; ++k) unicode::append(f, fill);
    return prefix + f + body;
  }
  return pad(prefix + body, width, align ? align : '>', fill);
}

std::string str_format(Interpreter& ip, const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  bool used_auto = false, used_manual = false;
  for (size_t i = 0; i < fmt.size();) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out += '}';
        i += 2;
        continue;
      }
      eval_fail("Single '}}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      ++i;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      i += 2;
      continue;
    }
    // Find the matching close brace (specs may nest one level of fields).
    size_t j = i + 1;
    int depth = 1;
    while (j < fmt.size() && depth) {
      if (fmt[j] == '{')
        ++depth;
      else if (fmt[j] == '}')
        --depth;
      if (depth) ++j;
    }
    if (j >= fmt.size()) eval_fail("expected '}}' before end of string");
    std::string field = fmt.substr(i + 1, j - i - 1);
    i = j + 1;
    std::string spec, conv;
    size_t colon = std::string::npos;
    for (size_t k = 0, br = 0; k < field.size(); ++k) {
      if (field[k] == '[')
        ++br;
      else if (field[k] == ']' && br)
        --br;
      else if (field[k] == ':' && !br) {
        colon = k;
        break;
      }
    }
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    size_t bang = field.find('!');
    if (bang != std::string::npos) {
      conv = field.substr(bang + 1);
      field.resize(bang);
    }
    size_t name_end = field.find_first_of(".[");
    std::string first = field.substr(0, name_end);
    Value v;
    if (first.empty()) {
      if (used_manual)
        eval_fail("cannot switch from manual field specification to automatic field numbering");
      used_auto = true;
      if (auto_index >= args.pos.size())
        eval_fail("Replacement index {} out of range for positional args tuple", auto_index);
      v = args.pos[auto_index++];
    } else if (std::all_of(first.begin(), first.end(),
                           [](char ch) { return ch >= '0' && ch <= '9'; })) {
      if (used_auto)
        eval_fail("cannot switch from automatic field numbering to manual field specification");
      used_manual = true;
      size_t k = std::stoul(first);
      if (k >= args.pos.size())
        eval_fail("Replacement index {} out of range for positional args tuple", k);
      v = args.pos[k];
    } else {
      auto it = std::find_if(args.kw.begin(), args.kw.end(),
                             [&](const auto& kv) { return kv.first == first; });
      if (it == args.kw.end()) eval_fail("KeyError: {}", string_repr(first));
      v = it->second;
    }
    for (size_t k = name_end; k != std::string::npos && k < field.size();) {
      if (field[k] == '.') {
        size_t e = field.find_first_of(".[", k + 1);
        v = ip.getattr(v,
                       field.substr(k + 1, e == std::string::npos ? std::string::npos : e - k - 1));
        k = e;
      } else {
        size_t e = field.find(']', k);
        if (e == std::string::npos) eval_fail("Missing ']' in format string");
        std::string key = field.substr(k + 1, e - k - 1);
        bool numeric = !key.empty() && std::all_of(key.begin(), key.end(),
                                                   [](char ch) { return ch >= '0' && ch <= '9'; });
        v = ip.getitem(v, numeric ? Value::integer(std::stoll(key)) : Value::string(key));
        k = e + 1;
      }
    }
    if (conv == "r")
      v = Value::string(repr(v));
    else if (conv == "s")
      v = Value::string(to_str(v));
    else if (conv == "a")
      v = Value::string(ascii_repr(v));
    else if (!conv.empty())
      eval_fail("Unknown conversion specifier {}", conv);
    if (spec.find('{') != std::string::npos) spec = str_format(ip, spec, args);
    if (v.is_undefined()) {
      if (!spec.empty()) undefined_fail(v);
      continue;
    }
    out += format_spec(v, spec);
  }
  return out;
}

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    char32_t c = unicode::decode(s, i);
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c > 0x7E)) {
      if (c >= 0x10000) {
        char32_t v = c - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", static_cast<unsigned>(0xD800 + (v >> 10)),
                           static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      }
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return float_repr(d);
}

void json_value(std::string& out, const Value& v, const JsonOptions& o, int level) {
  NestingGuard guard;
  auto newline = [&](int lvl) {
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += *o.indent;
  };
  switch (v.type()) {
    case Value::Type::kNone:
      out += "null";
      return;
    case Value::Type::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Type::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Type::kFloat:
      out += json_float(v.as_double());
      return;
    case Value::Type::kString:
      json_string(out, v.str(), o.ensure_ascii);
      return;
    case Value::Type::kList: {
      const auto& l = v.list();
      if (!v.is_sequence()) break;
      if (l.items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += o.item_separator;
        if (o.indent) newline(level + 1);
        json_value(out, l.items[i], o, level + 1);
      }
      if (o.indent) newline(level);
      out += ']';
      return;
    }
    case Value::Type::kDict: {
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& e : v.dict().entries) entries.push_back(&e);
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return less(a->first, b->first); });
      }
      out += '{';
      bool first = true;
      for (const auto* e : entries) {
        if (!first) out += o.item_separator;
        first = false;
        if (o.indent) newline(level + 1);
        const Value& k = e->first;
        if (k.is_string())
          json_string(out, k.str(), o.ensure_ascii);
        else if (k.is_bool())
          out += k.as_bool() ? "\"true\"" : "\"false\"";
        else if (k.is_int())
          out += "\"" + std::to_string(k.as_int()) + "\"";
        else if (k.is_float())
          out += "\"" + json_float(k.as_double()) + "\"";
        else if (k.is_none())
          out += "\"null\"";
        else
          eval_fail("keys must be str, int, float, bool or None, not {}", type_name(k));
        out += o.key_separator;
        json_value(out, e->second, o, level + 1);
      }
      if (o.indent) newline(level);
      out += '}';
      return;
    }
    default:
      break;
  }
  eval_fail("Object of type {} is not JSON serializable", type_name(v));
}

}  // namespace

std::string json_dumps(const Value& v, const JsonOptions& options) {
  std::string out;
  json_value(out, v, options, 0);
  return out;
}

}  // namespace atom::jinja
