#include "jinja/methods.h"

#include <algorithm>
#include <array>

#include "jinja/interpreter.h"
#include "jinja/py_format.h"
#include "jinja/unicode.h"

namespace atom::jinja {

namespace {

using Method = Value (*)(Interpreter& ip, const Value& self, CallArgs& args);

const std::string& arg_str(const Value& v, const char* what) {
  if (!v.is_string()) eval_fail("{} must be str, not {}", what, type_name(v));
  return v.str();
}

int64_t arg_int(const std::optional<Value>& v, int64_t dflt) {
  if (!v || v->is_none()) return dflt;
  if (!v->is_integral())
    eval_fail("'{}' object cannot be interpreted as an integer", type_name(*v));
  return v->as_int();
}

char32_t arg_fill(const std::optional<Value>& v) {
  if (!v) return ' ';
  const std::string& s = arg_str(*v, "fill character");
  if (unicode::length(s) != 1) eval_fail("The fill character must be exactly one character long");
  size_t i = 0;
  return unicode::decode(s, i);
}

// Python's slice-style clamping of [start, end) for find/count/startswith.
std::pair<size_t, size_t> span(const std::optional<Value>& start, const std::optional<Value>& end,
                               size_t len) {
  auto fix = [&](const std::optional<Value>& v, int64_t dflt) {
    int64_t i = arg_int(v, dflt);
    if (i < 0) i = std::max<int64_t>(0, i + static_cast<int64_t>(len));
    return static_cast<size_t>(std::min<int64_t>(i, static_cast<int64_t>(len)));
  };
  return {fix(start, 0), fix(end, static_cast<int64_t>(len))};
}

std::u32string u32(const Value& v) { return unicode::to_u32(v.str()); }

// str.find / rfind / index / rindex / count on code points.
int64_t find_impl(const Value& self, CallArgs& args, bool reverse, const char* name) {
  auto sub_v = args.take(0, "sub");
  if (!sub_v) eval_fail("{}() takes at least 1 argument (0 given)", name);
  std::u32string s = u32(self), sub = unicode::to_u32(arg_str(*sub_v, "substring"));
  auto [b, e] = span(args.take(1, "start"), args.take(2, "end"), s.size());
  args.finish(name, 3);
  if (b > e) return -1;
  if (sub.empty()) return static_cast<int64_t>(reverse ? e : b);
  if (e - b < sub.size()) return -1;
  std::u32string_view hay(s.data() + b, e - b);
  size_t pos = reverse ? hay.rfind(sub) : hay.find(sub);
  return pos == std::u32string_view::npos ? -1 : static_cast<int64_t>(pos + b);
}

Value affix_impl(const Value& self, CallArgs& args, bool prefix) {
  const char* name = prefix ? "startswith" : "endswith";
  auto p = args.take(0, "prefix");
  if (!p) eval_fail("{}() takes at least 1 argument (0 given)", name);
  std::u32string s = u32(self);
  auto [b, e] = span(args.take(1, "start"), args.take(2, "end"), s.size());
  args.finish(name, 3);
  std::vector<Value> options = p->is_tuple() ? p->list().items : std::vector<Value>{*p};
  for (const auto& o : options) {
    if (!o.is_string()) {
      eval_fail("{} first arg must be str or a tuple of str, not {}", name, type_name(o));
    }
    std::u32string a = unicode::to_u32(o.str());
    if (b > e || e - b < a.size()) continue;
    std::u32string_view win(s.data() + b, e - b);
    if (prefix ? win.substr(0, a.size()) == a : win.substr(win.size() - a.size()) == a)
      return Value::boolean(true);
  }
  return Value::boolean(false);
}

template <bool (*Pred)(char32_t)>
Value all_chars(const Value& self, CallArgs& args, const char* name) {
  args.finish(name, 0);
  std::u32string s = u32(self);
  if (s.empty()) return Value::boolean(false);
  return Value::boolean(std::all_of(s.begin(), s.end(), Pred));
}

Value strip_impl(const Value& self, CallArgs& args, bool left, bool right, const char* name) {
  auto chars = args.take(0, "chars");
  args.finish(name, 1);
  if (chars && !chars->is_none()) {
    return Value::string(unicode::strip(self.str(), &arg_str(*chars, "chars"), left, right));
  }
  return Value::string(unicode::strip(self.str(), nullptr, left, right));
}

Value split_impl(const Value& self, CallArgs& args, bool right) {
  auto sep = args.take(0, "sep");
  int64_t maxsplit = arg_int(args.take(1, "maxsplit"), -1);
  args.finish(right ? "rsplit" : "split", 2);
  return Value::list(str_split(self.str(), sep ? *sep : Value::none(), maxsplit, right));
}

Value partition_impl(const Value& self, CallArgs& args, bool right) {
  auto sep_v = args.take(0, "sep");
  args.finish(right ? "rpartition" : "partition", 1);
  if (!sep_v) eval_fail("partition() takes exactly one argument (0 given)");
  const std::string& s = self.str();
  const std::string& sep = arg_str(*sep_v, "sep");
  if (sep.empty()) eval_fail("empty separator");
  size_t pos = right ? s.rfind(sep) : s.find(sep);
  if (pos == std::string::npos) {
    if (right) return Value::tuple({Value::string(""), Value::string(""), self});
    return Value::tuple({self, Value::string(""), Value::string("")});
  }
  return Value::tuple({Value::string(s.substr(0, pos)), Value::string(sep),
                       Value::string(s.substr(pos + sep.size()))});
}

Value just_impl(const Value& self, CallArgs& args, char align, const char* name) {
  auto w = args.take(0, "width");
  if (!w) eval_fail("{}() takes at least 1 argument (0 given)", name);
  int64_t width = arg_int(w, 0);
  char32_t fill = arg_fill(args.take(1, "fillchar"));
  args.finish(name, 2);
  if (align == '^') return Value::string(str_center(self.str(), width, fill));
  std::u32string s = u32(self);
  if (width <= static_cast<int64_t>(s.size())) return self;
  std::u32string padding(static_cast<size_t>(width) - s.size(), fill);
  return Value::string(unicode::from_u32(align == '<' ? s + padding : padding + s));
}

Value str_method(Interpreter& ip, const Value& self, const std::string& name, CallArgs& args) {
  const std::string& s = self.str();
  if (name == "startswith") return affix_impl(self, args, true);
  if (name == "endswith") return affix_impl(self, args, false);
  if (name == "strip") return strip_impl(self, args, true, true, "strip");
  if (name == "lstrip") return strip_impl(self, args, true, false, "lstrip");
  if (name == "rstrip") return strip_impl(self, args, false, true, "rstrip");
  if (name == "split") return split_impl(self, args, false);
  if (name == "rsplit") return split_impl(self, args, true);
  if (name == "lower" || name == "casefold") {
    args.finish(name, 0);
    return Value::string(unicode::lower(s));
  }
  if (name == "upper") {
    args.finish(name, 0);
    return Value::string(unicode::upper(s));
  }
  if (name == "title") {
    args.finish(name, 0);
    return Value::string(str_title(s));
  }
  if (name == "capitalize") {
    args.finish(name, 0);
    return Value::string(str_capitalize(s));
  }
  if (name == "swapcase") {
    args.finish(name, 0);
    std::string out;
    for (size_t i = 0; i < s.size();) {
      char32_t c = unicode::decode(s, i);
      unicode::append(out, unicode::is_upper(c)   ? unicode::to_lower(c)
                           : unicode::is_lower(c) ? unicode::to_upper(c)
                                                  : c);
    }
    return Value::string(std::move(out));
  }
  if (name == "replace") {
    auto old_v = args.take(0, "old"), new_v = args.take(1, "new");
    int64_t count = arg_int(args.take(2, "count"), -1);
    args.finish(name, 3);
    if (!old_v || !new_v) eval_fail("replace() takes at least 2 arguments");
    std::string out = str_replace(s, arg_str(*old_v, "replace() argument 1"),
                                  arg_str(*new_v, "replace() argument 2"), count);
    ip.check_size(out.size());
    return Value::string(std::move(out));
  }
  if (name == "find") return Value::integer(find_impl(self, args, false, "find"));
  if (name == "rfind") return Value::integer(find_impl(self, args, true, "rfind"));
  if (name == "index" || name == "rindex") {
    int64_t r = find_impl(self, args, name == "rindex", name.c_str());
    if (r < 0) eval_fail("substring not found");
    return Value::integer(r);
  }
  if (name == "count") {
    auto sub_v = args.take(0, "sub");
    if (!sub_v) eval_fail("count() takes at least 1 argument (0 given)");
    std::u32string str = u32(self), sub = unicode::to_u32(arg_str(*sub_v, "substring"));
    auto [b, e] = span(args.take(1, "start"), args.take(2, "end"), str.size());
    args.finish(name, 3);
    if (b > e) return Value::integer(0);
    if (sub.empty()) return Value::integer(static_cast<int64_t>(e - b + 1));
    int64_t n = 0;
    std::u32string_view hay(str.data() + b, e - b);
    for (size_t p = hay.find(sub); p != std::u32string_view::npos;
         p = hay.find(sub, p + sub.size()))
      ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    auto it = args.take(0, "iterable");
    args.finish(name, 1);
    if (!it) eval_fail("join() takes exactly one argument (0 given)");
    std::string out;
    size_t k = 0;
    for (const auto& item : iterate(*it)) {
      if (!item.is_string()) {
        eval_fail("sequence item {}: expected str instance, {} found", k, type_name(item));
      }
      if (k++) out += s;
      out += item.str();
      ip.check_size(out.size());
    }
    return Value::string(std::move(out));
  }
  if (name == "format") return Value::string(str_format(ip, s, args));
  if (name == "splitlines") {
    bool keepends = false;
    if (auto k = args.take(0, "keepends")) keepends = truthy(*k);
    args.finish(name, 1);
    std::vector<Value> out;
    for (auto& line : str_splitlines(s, keepends)) out.push_back(Value::string(std::move(line)));
    return Value::list(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    auto a = args.take(0, "affix");
    args.finish(name, 1);
    if (!a) eval_fail("{}() takes exactly one argument (0 given)", name);
    const std::string& x = arg_str(*a, name.c_str());
    if (name == "removeprefix" && s.compare(0, x.size(), x) == 0)
      return Value::string(s.substr(x.size()));
    if (name == "removesuffix" && !x.empty() && s.size() >= x.size() &&
        s.compare(s.size() - x.size(), x.size(), x) == 0) {
      return Value::string(s.substr(0, s.size() - x.size()));
    }
    return self;
  }
  if (name == "partition") return partition_impl(self, args, false);
  if (name == "rpartition") return partition_impl(self, args, true);
  if (name == "center") return just_impl(self, args, '^', "center");
  if (name == "ljust") return just_impl(self, args, '<', "ljust");
  if (name == "rjust") return just_impl(self, args, '>', "rjust");
  if (name == "zfill") {
    int64_t width = arg_int(args.take(0, "width"), 0);
    args.finish(name, 1);
    std::u32string str = u32(self);
    if (width <= static_cast<int64_t>(str.size())) return self;
    size_t fill = static_cast<size_t>(width) - str.size();
    size_t at = !str.empty() && (str[0] == '+' || str[0] == '-') ? 1 : 0;
    str.insert(at, fill, U'0');
    return Value::string(unicode::from_u32(str));
  }
  if (name == "isdigit") return all_chars<unicode::is_digit>(self, args, "isdigit");
  if (name == "isdecimal") return all_chars<unicode::is_decimal>(self, args, "isdecimal");
  if (name == "isnumeric") return all_chars<unicode::is_numeric>(self, args, "isnumeric");
  if (name == "isalpha") return all_chars<unicode::is_alpha>(self, args, "isalpha");
  if (name == "isalnum") return all_chars<unicode::is_alnum>(self, args, "isalnum");
  if (name == "isspace") return all_chars<unicode::is_space>(self, args, "isspace");
  if (name == "isascii") {
    args.finish(name, 0);
    return Value::boolean(unicode::is_ascii(s));
  }
  if (name == "isprintable") {
    args.finish(name, 0);
    std::u32string str = u32(self);
    return Value::boolean(std::all_of(str.begin(), str.end(), unicode::is_printable));
  }
  if (name == "isupper" || name == "islower") {
    args.finish(name, 0);
    bool cased = false;
    for (char32_t c : u32(self)) {
      if (name == "isupper" ? (unicode::is_lower(c) || unicode::is_title(c))
                            : (unicode::is_upper(c) || unicode::is_title(c))) {
        return Value::boolean(false);
      }
      cased = cased || unicode::is_cased(c);
    }
    return Value::boolean(cased);
  }
  if (name == "istitle") {
    args.finish(name, 0);
    bool cased = false, prev_cased = false;
    for (char32_t c : u32(self)) {
      if (unicode::is_upper(c) || unicode::is_title(c)) {
        if (prev_cased) return Value::boolean(false);
        prev_cased = cased = true;
      } else if (unicode::is_lower(c)) {
        if (!prev_cased) return Value::boolean(false);
        prev_cased = cased = true;
      } else {
        prev_cased = false;
      }
    }
    return Value::boolean(cased);
  }
  if (name == "isidentifier") {
    args.finish(name, 0);
    std::u32string str = u32(self);
    bool ok = !str.empty() && (str[0] == '_' || unicode::is_alpha(str[0]));
    for (size_t i = 1; ok && i < str.size(); ++i) ok = unicode::is_word(str[i]);
    return Value::boolean(ok);
  }
  eval_fail("str.{}() is not supported by atom's template engine", name);
}

constexpr std::array<const char*, 47> kStrMethods = {
    "capitalize",   "casefold",    "center",    "count",      "encode",       "endswith",
    "expandtabs",   "find",        "format",    "format_map", "index",        "isalnum",
    "isalpha",      "isascii",     "isdecimal", "isdigit",    "isidentifier", "islower",
    "isnumeric",    "isprintable", "isspace",   "istitle",    "isupper",      "join",
    "ljust",        "lower",       "lstrip",    "maketrans",  "partition",    "removeprefix",
    "removesuffix", "replace",     "rfind",     "rindex",     "rjust",        "rpartition",
    "rsplit",       "rstrip",      "split",     "splitlines", "startswith",   "strip",
    "swapcase",     "title",       "translate", "upper",      "zfill"};

bool in_list(std::initializer_list<const char*> names, const std::string& name) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return name == n; });
}

Value unsafe(const Value& obj, const std::string& name) {
  return Value::undefined(
      fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(obj)));
}

Value bind(const Value& self, const std::string& name,
           Value (*impl)(Interpreter&, const Value&, const std::string&, CallArgs&)) {
  return make_function(name, [self, name, impl](Interpreter& ip, CallArgs& args) {
    return impl(ip, self, name, args);
  });
}

Value dict_method(Interpreter&, const Value& self, const std::string& name, CallArgs& args) {
  const DictData& d = self.dict();
  if (name == "get") {
    auto key = args.take(0, "key");
    auto dflt = args.take(1, "default");
    args.finish("get", 2);
    if (!key) eval_fail("get expected at least 1 argument, got 0");
    check_hashable(*key);
    if (const Value* v = d.find(*key)) return *v;
    return dflt ? *dflt : Value::none();
  }
  args.finish(name, 0);
  if (name == "copy") return self;
  std::vector<Value> out;
  for (const auto& [k, v] : d.entries) {
    if (name == "keys")
      out.push_back(k);
    else if (name == "values")
      out.push_back(v);
    else
      out.push_back(Value::tuple({k, v}));
  }
  ListKind kind = name == "keys"     ? ListKind::kDictKeys
                  : name == "values" ? ListKind::kDictValues
                                     : ListKind::kDictItems;
  return Value::list(std::move(out), kind);
}

Value list_method(Interpreter&, const Value& self, const std::string& name, CallArgs& args) {
  const auto& items = self.list().items;
  if (name == "copy") {
    args.finish(name, 0);
    return Value::list(items);
  }
  auto x = args.take(0, "value");
  if (!x) eval_fail("{}() takes at least 1 argument (0 given)", name);
  if (name == "count") {
    args.finish(name, 1);
    int64_t n = 0;
    for (const auto& v : items) n += equal(v, *x);
    return Value::integer(n);
  }
  auto [b, e] = span(args.take(1, "start"), args.take(2, "stop"), items.size());
  args.finish(name, 3);
  for (size_t i = b; i < e; ++i) {
    if (equal(items[i], *x)) return Value::integer(static_cast<int64_t>(i));
  }
  eval_fail("{} is not in {}", repr(*x), type_name(self));
}

}  // namespace

std::optional<Value> python_attribute(const Value& obj, const std::string& name) {
  switch (obj.type()) {
    case Value::Type::kString:
      if (std::find_if(kStrMethods.begin(), kStrMethods.end(),
                       [&](const char* n) { return name == n; }) != kStrMethods.end()) {
        return bind(obj, name, str_method);
      }
      return std::nullopt;
    case Value::Type::kDict:
      if (in_list({"keys", "values", "items", "get", "copy"}, name))
        return bind(obj, name, dict_method);
      if (in_list({"clear", "pop", "popitem", "setdefault", "update"}, name))
        return unsafe(obj, name);
      if (name == "fromkeys") {
        return make_function(name, [](Interpreter&, CallArgs&) -> Value {
          eval_fail("dict.fromkeys() is not supported by atom's template engine");
        });
      }
      return std::nullopt;
    case Value::Type::kList:
      switch (obj.list().kind) {
        case ListKind::kList:
          if (in_list({"index", "count", "copy"}, name)) return bind(obj, name, list_method);
          if (in_list({"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"},
                      name)) {
            return unsafe(obj, name);
          }
          return std::nullopt;
        case ListKind::kGroup:
          if (name == "grouper") return obj.list().items[0];
          if (name == "list") return obj.list().items[1];
          [[fallthrough]];
        case ListKind::kTuple:
          if (in_list({"index", "count"}, name)) return bind(obj, name, list_method);
          return std::nullopt;
        default:
          return std::nullopt;
      }
    default:
      return std::nullopt;
  }
}

std::vector<Value> str_split(const std::string& s, const Value& sep_v, int64_t maxsplit,
                             bool right) {
  std::vector<Value> out;
  if (sep_v.is_none()) {
    std::u32string str = unicode::to_u32(s);
    if (!right) {
      size_t i = 0, n = str.size();
      while (true) {
        while (i < n && unicode::is_space(str[i])) ++i;
        if (i >= n) break;
        if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
          out.push_back(Value::string(unicode::from_u32(str.substr(i))));
          break;
        }
        size_t j = i;
        while (j < n && !unicode::is_space(str[j])) ++j;
        out.push_back(Value::string(unicode::from_u32(str.substr(i, j - i))));
        i = j;
      }
    } else {
      size_t i = str.size();
      while (true) {
        while (i > 0 && unicode::is_space(str[i - 1])) --i;
        if (i == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
          out.push_back(Value::string(unicode::from_u32(str.substr(0, i))));
          break;
        }
        size_t j = i;
        while (j > 0 && !unicode::is_space(str[j - 1])) --j;
        out.push_back(Value::string(unicode::from_u32(str.substr(j, i - j))));
        i = j;
      }
      std::reverse(out.begin(), out.end());
    }
    return out;
  }
  const std::string& sep = arg_str(sep_v, "must be str or None, not");
  if (sep.empty()) eval_fail("empty separator");
  if (!right) {
    size_t start = 0;
    while (true) {
      size_t pos = maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit
                       ? std::string::npos
                       : s.find(sep, start);
      if (pos == std::string::npos) {
        out.push_back(Value::string(s.substr(start)));
        break;
      }
      out.push_back(Value::string(s.substr(start, pos - start)));
      start = pos + sep.size();
    }
  } else {
    size_t end = s.size();
    while (true) {
      size_t pos = std::string::npos;
      if (!(maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) && end >= sep.size()) {
        pos = s.rfind(sep, end - sep.size());
      }
      if (pos == std::string::npos) {
        out.push_back(Value::string(s.substr(0, end)));
        break;
      }
      out.push_back(Value::string(s.substr(pos + sep.size(), end - pos - sep.size())));
      end = pos;
    }
    std::reverse(out.begin(), out.end());
  }
  return out;
}

std::vector<std::string> str_splitlines(const std::string& s, bool keepends) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < s.size();) {
    size_t at = i;
    char32_t c = unicode::decode(s, i);
    if (!unicode::is_line_break(c)) continue;
    if (c == '\r' && i < s.size() && s[i] == '\n') ++i;
    out.push_back(s.substr(start, (keepends ? i : at) - start));
    start = i;
  }
  if (start < s.size()) out.push_back(s.substr(start));
  return out;
}

std::string str_replace(const std::string& s, const std::string& old, const std::string& repl,
                        int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    // Python inserts the replacement before every character and at the end.
    for (size_t i = 0; i < s.size();) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      size_t start = i;
      unicode::decode(s, i);
      out.append(s, start, i - start);
    }
    if (count < 0 || done < count) out += repl;
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    size_t pos = s.find(old, start);
    if (pos == std::string::npos) break;
    out.append(s, start, pos - start);
    out += repl;
    start = pos + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

std::string str_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    char32_t c = unicode::decode(s, i);
    unicode::append(out, prev_cased ? unicode::to_lower(c) : unicode::to_title(c));
    prev_cased = unicode::is_cased(c);
  }
  return out;
}

std::string str_capitalize(const std::string& s) {
  std::string out;
  bool first = true;
  for (size_t i = 0; i < s.size();) {
    char32_t c = unicode::decode(s, i);
    unicode::append(out, first ? unicode::to_title(c) : unicode::to_lower(c));
    first = false;
  }
  return out;
}

std::string str_center(const std::string& s, int64_t width, char32_t fill) {
  std::u32string str = unicode::to_u32(s);
  int64_t len = static_cast<int64_t>(str.size());
  if (width <= len) return s;
  int64_t marg = width - len;
  int64_t left = marg / 2 + (marg & width & 1);
  std::u32string out(static_cast<size_t>(left), fill);
  out += str;
  out.append(static_cast<size_t>(marg - left), fill);
  return unicode::from_u32(out);
}

}  // namespace atom::jinja
