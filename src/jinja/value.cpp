#include "jinja/value.h"

#include <charconv>
#include <cmath>

#include "jinja/unicode.h"

namespace atom::jinja {

Value Value::undefined(std::string hint) {
  return Value(Raw(Undefined{std::make_shared<const std::string>(std::move(hint))}));
}

Value Value::list(std::vector<Value> items, ListKind kind) {
  auto d = std::make_shared<ListData>();
  d->items = std::move(items);
  d->kind = kind;
  return Value(Raw(ListPtr(std::move(d))));
}

std::string Value::undefined_hint() const {
  const auto& u = std::get<Undefined>(v_);
  return u.hint ? *u.hint : std::string("value is undefined");
}

const Value* DictData::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.str()));
  for (const auto& [k, v] : entries) {
    if (equal(k, key)) return &v;
  }
  return nullptr;
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k.is_string() && k.str() == key) return &v;
  }
  return nullptr;
}

void DictData::set(Value key, Value value) {
  for (auto& [k, v] : entries) {
    if (equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

std::optional<Value> CallArgs::take(size_t index, std::string_view name) {
  if (taken_.size() < pos.size() + kw.size()) taken_.resize(pos.size() + kw.size(), false);
  for (size_t i = 0; i < kw.size(); ++i) {
    if (kw[i].first == name) {
      if (index < pos.size()) eval_fail("got multiple values for argument '{}'", name);
      taken_[pos.size() + i] = true;
      return kw[i].second;
    }
  }
  if (index < pos.size()) {
    taken_[index] = true;
    return pos[index];
  }
  return std::nullopt;
}

void CallArgs::finish(std::string_view callee, size_t max_positional) {
  if (pos.size() > max_positional) {
    eval_fail("{}() takes at most {} positional argument(s) ({} given)", callee, max_positional,
              pos.size());
  }
  if (taken_.size() < pos.size() + kw.size()) taken_.resize(pos.size() + kw.size(), false);
  for (size_t i = 0; i < kw.size(); ++i) {
    if (!taken_[pos.size() + i]) {
      eval_fail("{}() got an unexpected keyword argument '{}'", callee, kw[i].first);
    }
  }
}

Value Object::call(Interpreter&, CallArgs&) {
  eval_fail("'{}' object is not callable", type_name());
}

std::vector<Value> Object::drain() { eval_fail("'{}' object is not iterable", type_name()); }

std::vector<Value> IteratorObject::drain() {
  std::vector<Value> out(items_.begin() + static_cast<std::ptrdiff_t>(pos_), items_.end());
  pos_ = items_.size();
  return out;
}

Value make_iterator(std::vector<Value> items, std::string type_name) {
  return Value::object(std::make_shared<IteratorObject>(std::move(items), std::move(type_name)));
}

std::string type_name(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined:
      return "Undefined";
    case Value::Type::kNone:
      return "NoneType";
    case Value::Type::kBool:
      return "bool";
    case Value::Type::kInt:
      return "int";
    case Value::Type::kFloat:
      return "float";
    case Value::Type::kString:
      return "str";
    case Value::Type::kList:
      switch (v.list().kind) {
        case ListKind::kList:
          return "list";
        case ListKind::kTuple:
          return "tuple";
        case ListKind::kDictKeys:
          return "dict_keys";
        case ListKind::kDictValues:
          return "dict_values";
        case ListKind::kDictItems:
          return "dict_items";
        case ListKind::kGroup:
          return "_GroupTuple";
      }
      return "list";
    case Value::Type::kDict:
      return "dict";
    case Value::Type::kObject:
      return v.obj().type_name();
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined:
      return false;
    case Value::Type::kNone:
      return false;
    case Value::Type::kBool:
      return v.as_bool();
    case Value::Type::kInt:
      return v.as_int() != 0;
    case Value::Type::kFloat:
      return v.as_double() != 0.0;
    case Value::Type::kString:
      return !v.str().empty();
    case Value::Type::kList:
      return !v.list().items.empty();
    case Value::Type::kDict:
      return !v.dict().entries.empty();
    case Value::Type::kObject:
      return v.obj().truthy();
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  NestingGuard guard;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return true;
    case Value::Type::kString:
      return a.str_ptr() == b.str_ptr() || a.str() == b.str();
    case Value::Type::kList: {
      if (a.list_ptr() == b.list_ptr()) return true;  // Python compares items by identity first
      const auto& x = a.list();
      const auto& y = b.list();
      // Views compare like sets in Python; list vs tuple never compare equal.
      if (base_kind(x.kind) != base_kind(y.kind) || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!equal(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case Value::Type::kDict: {
      if (a.dict_ptr() == b.dict_ptr()) return true;
      const auto& x = a.dict();
      const auto& y = b.dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* other = y.find(k);
        if (!other || !equal(v, *other)) return false;
      }
      return true;
    }
    case Value::Type::kObject:
      return a.obj_ptr() == b.obj_ptr();
    default:
      return false;
  }
}

bool less(const Value& a, const Value& b) {
  NestingGuard guard;
  if (a.is_undefined()) undefined_fail(a);
  if (b.is_undefined()) undefined_fail(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 order is code point order
  if (a.is_sequence() && b.is_sequence() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.list().items;
    const auto& y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equal(x[i], y[i])) return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  eval_fail("'<' not supported between instances of '{}' and '{}'", type_name(a), type_name(b));
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then laid out as Python's repr does.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += exp < 0 ? "e-" : "e+";
    std::string es = std::to_string(exp < 0 ? -exp : exp);
    if (es.size() < 2) es = "0" + es;
    out += es;
  } else if (exp < 0) {
    out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else {
    size_t int_len = static_cast<size_t>(exp) + 1;
    if (digits.size() <= int_len) {
      out += digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  }
  return out;
}

std::string string_repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    char32_t c = unicode::decode(s, i);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!unicode::is_printable(c)) {
      if (c < 0x100) {
        out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
      } else if (c < 0x10000) {
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      } else {
        out += fmt::format("\\U{:08x}", static_cast<unsigned>(c));
      }
    } else {
      unicode::append(out, c);
    }
  }
  out += quote;
  return out;
}

std::string to_str(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined:
      return "";
    case Value::Type::kString:
      return v.str();
    case Value::Type::kObject:
      return v.obj().repr();
    default:
      return repr(v);
  }
}

static std::string join_repr(const std::vector<Value>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += repr(items[i]);
  }
  return out;
}

std::string repr(const Value& v) {
  NestingGuard guard;
  switch (v.type()) {
    case Value::Type::kUndefined:
      return "Undefined";
    case Value::Type::kNone:
      return "None";
    case Value::Type::kBool:
      return v.as_bool() ? "True" : "False";
    case Value::Type::kInt:
      return std::to_string(v.as_int());
    case Value::Type::kFloat:
      return float_repr(v.as_double());
    case Value::Type::kString:
      return string_repr(v.str());
    case Value::Type::kList: {
      const auto& l = v.list();
      std::string inner = join_repr(l.items);
      switch (l.kind) {
        case ListKind::kList:
          return "[" + inner + "]";
        case ListKind::kTuple:
        case ListKind::kGroup:
          return "(" + inner + (l.items.size() == 1 ? ",)" : ")");
        case ListKind::kDictKeys:
          return "dict_keys([" + inner + "])";
        case ListKind::kDictValues:
          return "dict_values([" + inner + "])";
        case ListKind::kDictItems:
          return "dict_items([" + inner + "])";
      }
      return inner;
    }
    case Value::Type::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, val] : v.dict().entries) {
        if (!first) out += ", ";
        first = false;
        out += repr(k) + ": " + repr(val);
      }
      return out + "}";
    }
    case Value::Type::kObject:
      return v.obj().repr();
  }
  return "";
}

size_t length(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined:
      return 0;
    case Value::Type::kString:
      return unicode::length(v.str());
    case Value::Type::kList:
      return v.list().items.size();
    case Value::Type::kDict:
      return v.dict().entries.size();
    case Value::Type::kObject:
      if (auto n = v.obj().len()) return *n;
      [[fallthrough]];
    default:
      eval_fail("object of type '{}' has no len()", type_name(v));
  }
}

bool is_iterable(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kString:
    case Value::Type::kList:
    case Value::Type::kDict:
      return true;
    case Value::Type::kObject:
      return v.obj().is_iterator();
    default:
      return false;
  }
}

std::vector<Value> iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined:
      return {};
    case Value::Type::kString: {
      std::vector<Value> out;
      const std::string& s = v.str();
      for (size_t i = 0; i < s.size();) {
        size_t start = i;
        unicode::decode(s, i);
        out.push_back(Value::string(s.substr(start, i - start)));
      }
      return out;
    }
    case Value::Type::kList:
      return v.list().items;
    case Value::Type::kDict: {
      std::vector<Value> out;
      out.reserve(v.dict().entries.size());
      for (const auto& e : v.dict().entries) out.push_back(e.first);
      return out;
    }
    case Value::Type::kObject:
      if (v.obj().is_iterator()) return v.obj().drain();
      [[fallthrough]];
    default:
      eval_fail("'{}' object is not iterable", type_name(v));
  }
}

void check_hashable(const Value& v) {
  NestingGuard guard;
  if (v.is_tuple()) {
    for (const auto& x : v.list().items) check_hashable(x);
    return;
  }
  if (v.is_list() || v.is_dict()) eval_fail("unhashable type: '{}'", type_name(v));
}

void undefined_fail(const Value& v) {
  throw EvalError{TemplateError::Kind::kRuntime, v.undefined_hint()};
}

}  // namespace atom::jinja
