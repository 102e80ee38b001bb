// Filters on strings and numbers.
#include <cmath>
#include <cstdio>

#include "jinja/builtins.h"
#include "jinja/methods.h"
#include "jinja/py_format.h"
#include "jinja/py_ops.h"
#include "jinja/unicode.h"

namespace atom::jinja {

bool arg_bool(const std::optional<Value>& v, bool dflt) { return v ? truthy(*v) : dflt; }

int64_t arg_integer(const std::optional<Value>& v, int64_t dflt, const char* what) {
  if (!v) return dflt;
  if (!v->is_integral())
    eval_fail("{}: '{}' object cannot be interpreted as an integer", what, type_name(*v));
  return v->as_int();
}

namespace {

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Python int(str, base): whitespace, sign, optional matching prefix, digits with single '_'.
std::optional<int64_t> parse_py_int(const std::string& text, int base) {
  std::string s = unicode::strip(text, nullptr, true, true);
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (i + 1 < s.size() && s[i] == '0') {
    char p = static_cast<char>(s[i + 1] | 0x20);
    if ((p == 'x' && base == 16) || (p == 'o' && base == 8) || (p == 'b' && base == 2)) {
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (i >= s.size()) return std::nullopt;
  uint64_t v = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_') {
      if (!prev_digit || i + 1 >= s.size()) return std::nullopt;
      prev_digit = false;
      continue;
    }
    int d = c >= '0' && c <= '9'                     ? c - '0'
            : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10
                                                     : 99;
    if (d >= base) return std::nullopt;
    if (v > (static_cast<uint64_t>(INT64_MAX) - static_cast<uint64_t>(d)) /
                static_cast<uint64_t>(base)) {
      eval_fail("integer {} is too large (atom's template integers are 64-bit)", text);
    }
    v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    prev_digit = true;
  }
  return neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
}

// Python float(str).
std::optional<double> parse_py_float(const std::string& text) {
  std::string s = unicode::strip(text, nullptr, true, true);
  std::string lower = unicode::lower(s);
  size_t i = 0;
  std::string sign;
  if (!lower.empty() && (lower[0] == '+' || lower[0] == '-')) sign = lower.substr(0, 1), i = 1;
  std::string rest = lower.substr(i);
  if (rest == "inf" || rest == "infinity") return sign == "-" ? -INFINITY : INFINITY;
  if (rest == "nan") return NAN;
  std::string clean = sign;
  bool digits = false, prev_digit = false;
  size_t k = 0;
  auto take_digits = [&]() {
    bool any = false;
    while (k < rest.size()) {
      if (rest[k] >= '0' && rest[k] <= '9') {
        clean += rest[k++];
        any = prev_digit = true;
      } else if (rest[k] == '_' && prev_digit && k + 1 < rest.size() && rest[k + 1] >= '0' &&
                 rest[k + 1] <= '9') {
        ++k;
        prev_digit = false;
      } else {
        break;
      }
    }
    prev_digit = false;
    return any;
  };
  digits = take_digits();
  if (k < rest.size() && rest[k] == '.') {
    clean += rest[k++];
    digits = take_digits() || digits;
  }
  if (!digits) return std::nullopt;
  if (k < rest.size() && rest[k] == 'e') {
    clean += rest[k++];
    if (k < rest.size() && (rest[k] == '+' || rest[k] == '-')) clean += rest[k++];
    if (!take_digits()) return std::nullopt;
  }
  if (k != rest.size()) return std::nullopt;
  return std::strtod(clean.c_str(), nullptr);
}

// Python round(x, n) for floats: correctly rounded, ties to even.
double py_round(double x, int64_t n) {
  if (!std::isfinite(x)) return x;
  if (n >= 0) {
    if (n > 300) return x;
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(n), x);
    return std::strtod(buf, nullptr);
  }
  double pow1 = std::pow(10.0, static_cast<double>(-n));
  double y = x / pow1;
  double z = std::round(y);
  if (std::fabs(y - z) == 0.5) z = 2.0 * std::round(y / 2.0);
  return z * pow1;
}

int64_t round_int(int64_t v, int64_t n) {
  if (n >= 0) return v;
  if (n < -18) return 0;
  int64_t p = 1;
  for (int64_t k = 0; k < -n; ++k) p *= 10;
  int64_t q = v / p, r = v % p;
  if (r < 0) {
    r += p;
    --q;
  }
  if (2 * r > p || (2 * r == p && (q & 1))) ++q;
  return q * p;
}

std::string pprint_repr(const Value& v) {
  NestingGuard guard;
  if (v.is_dict()) {
    std::vector<const std::pair<Value, Value>*> items;
    for (const auto& e : v.dict().entries) items.push_back(&e);
    std::stable_sort(items.begin(), items.end(),
                     [](auto* a, auto* b) { return less(a->first, b->first); });
    std::string out = "{";
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += ", ";
      out += pprint_repr(items[i]->first) + ": " + pprint_repr(items[i]->second);
    }
    return out + "}";
  }
  if (v.is_sequence()) {
    std::string inner;
    const auto& items = v.list().items;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) inner += ", ";
      inner += pprint_repr(items[i]);
    }
    if (v.is_plain_list()) return "[" + inner + "]";
    return "(" + inner + (items.size() == 1 ? ",)" : ")");
  }
  return repr(v);
}

}  // namespace

void register_string_filters(std::unordered_map<std::string, FilterFn>& f) {
  auto unary = [](const char* name, std::string (*fn)(const std::string&)) {
    return [name, fn](Interpreter&, const Value& v, CallArgs& args) {
      args.finish(name, 0);
      return Value::string(fn(soft_str(v)));
    };
  };
  f["lower"] = unary("lower", [](const std::string& s) { return unicode::lower(s); });
  f["upper"] = unary("upper", [](const std::string& s) { return unicode::upper(s); });
  f["capitalize"] = unary("capitalize", str_capitalize);
  f["string"] = unary("string", [](const std::string& s) { return s; });
  f["safe"] = unary("safe", [](const std::string& s) { return s; });
  f["escape"] = unary("escape", html_escape);
  f["e"] = f["escape"];
  f["forceescape"] = f["escape"];
  // jinja2's title: capitalise each run after -, whitespace, (, {, [ or <.
  f["title"] = unary("title", [](const std::string& s) {
    std::u32string in = unicode::to_u32(s), out;
    auto sep = [](char32_t c) {
      return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || unicode::is_space(c);
    };
    size_t i = 0;
    while (i < in.size()) {
      size_t j = i;
      bool is_sep = sep(in[i]);
      while (j < in.size() && sep(in[j]) == is_sep) ++j;
      if (is_sep) {
        out.append(in, i, j - i);
      } else {
        out += unicode::to_upper(in[i]);
        for (size_t k = i + 1; k < j; ++k) out += unicode::to_lower(in[k]);
      }
      i = j;
    }
    return unicode::from_u32(out);
  });
  f["trim"] = [](Interpreter&, const Value& v, CallArgs& args) {
    auto chars = args.take(0, "chars");
    args.finish("trim", 1);
    std::string s = soft_str(v);
    if (chars && !chars->is_none()) {
      if (!chars->is_string()) eval_fail("strip arg must be None or str");
      return Value::string(unicode::strip(s, &chars->str(), true, true));
    }
    return Value::string(unicode::strip(s, nullptr, true, true));
  };
  f["replace"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    auto old_v = args.take(0, "old"), new_v = args.take(1, "new"), count = args.take(2, "count");
    args.finish("replace", 3);
    if (!old_v || !new_v) eval_fail("replace() missing required arguments");
    int64_t n = count && !count->is_none() ? arg_integer(count, -1, "replace") : -1;
    std::string out = str_replace(soft_str(v), soft_str(*old_v), soft_str(*new_v), n);
    ip.check_size(out.size());
    return Value::string(std::move(out));
  };
  f["center"] = [](Interpreter&, const Value& v, CallArgs& args) {
    int64_t width = arg_integer(args.take(0, "width"), 80, "center");
    args.finish("center", 1);
    return Value::string(str_center(soft_str(v), width, ' '));
  };
  f["indent"] = [](Interpreter&, const Value& v, CallArgs& args) {
    auto w = args.take(0, "width");
    bool first = arg_bool(args.take(1, "first"), false);
    bool blank = arg_bool(args.take(2, "blank"), false);
    args.finish("indent", 3);
    std::string ind;
    if (w && w->is_string())
      ind = w->str();
    else
      ind =
          std::string(static_cast<size_t>(std::max<int64_t>(0, arg_integer(w, 4, "indent"))), ' ');
    if (v.is_undefined()) undefined_fail(v);
    if (!v.is_string())
      eval_fail("unsupported operand type(s) for +=: '{}' and 'str'", type_name(v));
    std::vector<std::string> lines = str_splitlines(v.str() + "\n", false);
    std::string rv;
    if (blank) {
      for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
    } else {
      rv = lines.empty() ? "" : lines[0];
      for (size_t i = 1; i < lines.size(); ++i)
        rv += "\n" + (lines[i].empty() ? "" : ind + lines[i]);
    }
    if (first) rv = ind + rv;
    return Value::string(std::move(rv));
  };
  f["truncate"] = [](Interpreter&, const Value& v, CallArgs& args) {
    int64_t length = arg_integer(args.take(0, "length"), 255, "truncate");
    bool killwords = arg_bool(args.take(1, "killwords"), false);
    auto end_v = args.take(2, "end");
    auto leeway_v = args.take(3, "leeway");
    args.finish("truncate", 4);
    std::string end = end_v ? soft_str(*end_v) : "...";
    int64_t leeway = leeway_v && !leeway_v->is_none() ? arg_integer(leeway_v, 5, "truncate") : 5;
    int64_t end_len = static_cast<int64_t>(unicode::length(end));
    if (length < end_len) eval_fail("expected length >= {}, got {}", end_len, length);
    if (leeway < 0) eval_fail("expected leeway >= 0, got {}", leeway);
    if (v.is_undefined()) return v;
    if (!v.is_string()) eval_fail("object of type '{}' has no len()", type_name(v));
    std::u32string s = unicode::to_u32(v.str());
    if (static_cast<int64_t>(s.size()) <= length + leeway) return v;
    std::u32string head = s.substr(0, static_cast<size_t>(length - end_len));
    if (!killwords) {
      size_t sp = head.rfind(U' ');
      if (sp != std::u32string::npos) head.resize(sp);
    }
    return Value::string(unicode::from_u32(head) + end);
  };
  f["wordcount"] = [](Interpreter&, const Value& v, CallArgs& args) {
    args.finish("wordcount", 0);
    std::u32string s = unicode::to_u32(soft_str(v));
    int64_t n = 0;
    for (size_t i = 0; i < s.size();) {
      if (!unicode::is_word(s[i])) {
        ++i;
        continue;
      }
      ++n;
      while (i < s.size() && unicode::is_word(s[i])) ++i;
    }
    return Value::integer(n);
  };
  f["format"] = [](Interpreter&, const Value& v, CallArgs& args) {
    if (!args.pos.empty() && !args.kw.empty()) {
      eval_fail("can't handle positional and keyword arguments at the same time");
    }
    Value fmt_args;
    if (!args.kw.empty()) {
      DictData d;
      for (const auto& [k, x] : args.kw) d.set(Value::string(k), x);
      fmt_args = Value::dict(std::move(d));
    } else {
      fmt_args = Value::tuple(args.pos);
    }
    return Value::string(percent_format(soft_str(v), fmt_args));
  };
  f["int"] = [](Interpreter&, const Value& v, CallArgs& args) {
    Value dflt = args.take(0, "default").value_or(Value::integer(0));
    int64_t base = arg_integer(args.take(1, "base"), 10, "int");
    args.finish("int", 2);
    if (v.is_undefined()) undefined_fail(v);
    if (v.is_string()) {
      if (auto i = parse_py_int(v.str(), static_cast<int>(base))) return Value::integer(*i);
      if (auto d = parse_py_float(v.str())) {
        if (std::isnan(*d)) return dflt;
        if (std::isinf(*d)) eval_fail("cannot convert float infinity to integer");
        return Value::integer(static_cast<int64_t>(std::trunc(*d)));
      }
      return dflt;
    }
    if (v.is_integral()) return Value::integer(v.as_int());
    if (v.is_float()) {
      double d = v.as_double();
      if (std::isnan(d)) return dflt;
      if (std::isinf(d)) eval_fail("cannot convert float infinity to integer");
      return Value::integer(static_cast<int64_t>(std::trunc(d)));
    }
    return dflt;
  };
  f["float"] = [](Interpreter&, const Value& v, CallArgs& args) {
    Value dflt = args.take(0, "default").value_or(Value::number(0.0));
    args.finish("float", 1);
    if (v.is_undefined()) undefined_fail(v);
    if (v.is_number()) return Value::number(v.as_double());
    if (v.is_string()) {
      if (auto d = parse_py_float(v.str())) return Value::number(*d);
    }
    return dflt;
  };
  f["abs"] = [](Interpreter&, const Value& v, CallArgs& args) {
    args.finish("abs", 0);
    if (v.is_integral()) {
      if (v.as_int() == INT64_MIN) eval_fail("integer overflow");
      return Value::integer(std::llabs(v.as_int()));
    }
    if (v.is_float()) return Value::number(std::fabs(v.as_double()));
    eval_fail("bad operand type for abs(): '{}'", type_name(v));
  };
  f["round"] = [](Interpreter&, const Value& v, CallArgs& args) {
    int64_t precision = arg_integer(args.take(0, "precision"), 0, "round");
    Value method = args.take(1, "method").value_or(Value::string("common"));
    args.finish("round", 2);
    std::string m = method.is_string() ? method.str() : "";
    if (m != "common" && m != "ceil" && m != "floor")
      eval_fail("method must be common, ceil or floor");
    if (!v.is_number()) eval_fail("type {} doesn't define __round__ method", type_name(v));
    if (m == "common") {
      if (v.is_integral()) return Value::integer(round_int(v.as_int(), precision));
      return Value::number(py_round(v.as_double(), precision));
    }
    double scale = std::pow(10.0, static_cast<double>(precision));
    double x = v.as_double() * scale;
    return Value::number((m == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
  };
  // jinja2's own tojson (environments may override it, as transformers does): sorted keys,
  // ASCII output, and HTML-sensitive characters escaped.
  f["tojson"] = [](Interpreter&, const Value& v, CallArgs& args) {
    auto indent = args.take(0, "indent");
    args.finish("tojson", 1);
    JsonOptions o;
    o.sort_keys = true;
    if (indent && !indent->is_none()) {
      if (indent->is_string())
        o.indent = indent->str();
      else
        o.indent = std::string(
            static_cast<size_t>(std::max<int64_t>(0, arg_integer(indent, 0, "tojson"))), ' ');
      o.item_separator = ",";
    }
    std::string s = json_dumps(v, o), out;
    for (char c : s) {
      if (c == '<')
        out += "\\u003c";
      else if (c == '>')
        out += "\\u003e";
      else if (c == '&')
        out += "\\u0026";
      else if (c == '\'')
        out += "\\u0027";
      else
        out += c;
    }
    return Value::string(std::move(out));
  };
  f["pprint"] = [](Interpreter&, const Value& v, CallArgs& args) {
    args.finish("pprint", 0);
    std::string s = pprint_repr(v);
    if (unicode::length(s) > 80 && (v.is_list() || v.is_dict() || v.is_string())) {
      eval_fail("pprint of values longer than 80 characters is not supported by atom");
    }
    return Value::string(std::move(s));
  };
}

}  // namespace atom::jinja
