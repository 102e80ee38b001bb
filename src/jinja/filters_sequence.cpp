// Filters on sequences and mappings. Like jinja2, select/map/unique/items/batch/slice return
// one-shot generators and reverse returns an iterator: truthy even when empty, without a length.
#include <algorithm>

#include "jinja/builtins.h"
#include "jinja/methods.h"
#include "jinja/py_ops.h"
#include "jinja/unicode.h"

namespace atom::jinja {

Value attr_lookup(Interpreter& ip, const Value& item, const Value& attribute) {
  if (attribute.is_none()) return item;
  if (!attribute.is_string()) return ip.getitem(item, attribute);
  Value cur = item;
  for (const auto& part : str_split(attribute.str(), Value::string("."), -1, false)) {
    const std::string& p = part.str();
    bool digits =
        !p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = ip.getitem(cur, digits ? Value::integer(std::stoll(p)) : part);
  }
  return cur;
}

const std::vector<std::string>& unsupported_filters() {
  static const std::vector<std::string> names = {
      "filesizeformat", "random", "striptags", "urlencode", "urlize", "wordwrap", "xmlattr"};
  return names;
}

namespace {

Value ignore_case(const Value& v) {
  return v.is_string() ? Value::string(unicode::lower(v.str())) : v;
}

// Python's comparison of sort keys (lists of values).
bool key_less(const std::vector<Value>& a, const std::vector<Value>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!equal(a[i], b[i])) return less(a[i], b[i]);
  }
  return a.size() < b.size();
}

std::vector<Value> split_attributes(const std::optional<Value>& attribute) {
  if (!attribute || attribute->is_none()) return {Value::none()};
  if (attribute->is_string()) return str_split(attribute->str(), Value::string(","), -1, false);
  return {*attribute};
}

Value one_attr_getter(Interpreter& ip, const Value& item, const std::optional<Value>& attribute,
                      bool fold_case) {
  Value v = attribute ? attr_lookup(ip, item, *attribute) : item;
  return fold_case ? ignore_case(v) : v;
}

Value min_max(Interpreter& ip, const Value& v, CallArgs& args, bool is_max) {
  bool case_sensitive = arg_bool(args.take(0, "case_sensitive"), false);
  auto attribute = args.take(1, "attribute");
  args.finish(is_max ? "max" : "min", 2);
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = one_attr_getter(ip, items[0], attribute, !case_sensitive);
  for (size_t i = 1; i < items.size(); ++i) {
    Value key = one_attr_getter(ip, items[i], attribute, !case_sensitive);
    if (is_max ? less(best_key, key) : less(key, best_key)) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}

// select / reject / selectattr / rejectattr.
Value select_or_reject(Interpreter& ip, const Value& v, CallArgs& args, bool keep,
                       bool lookup_attr) {
  if (!truthy(v)) return make_iterator({});
  std::vector<Value> pos = args.pos;
  Value attr;
  size_t off = 0;
  if (lookup_attr) {
    if (pos.empty()) eval_fail("Missing parameter for attribute name");
    attr = pos[0];
    off = 1;
  }
  std::optional<std::string> test;
  if (pos.size() > off) {
    if (!pos[off].is_string()) eval_fail("test name must be a string");
    test = pos[off].str();
  }
  CallArgs test_args;
  if (pos.size() > off + 1)
    test_args.pos.assign(pos.begin() + static_cast<std::ptrdiff_t>(off + 1), pos.end());
  test_args.kw = args.kw;
  std::vector<Value> out;
  for (const auto& item : iterate(v)) {
    Value x = lookup_attr ? attr_lookup(ip, item, attr) : item;
    bool r;
    if (test) {
      CallArgs a = test_args;
      r = ip.apply_test(*test, x, a);
    } else {
      r = truthy(x);
    }
    if (r == keep) out.push_back(item);
  }
  return make_iterator(std::move(out));
}

}  // namespace

void register_sequence_filters(std::unordered_map<std::string, FilterFn>& f) {
  f["default"] = [](Interpreter&, const Value& v, CallArgs& args) {
    Value dflt = args.take(0, "default_value").value_or(Value::string(""));
    bool boolean = arg_bool(args.take(1, "boolean"), false);
    args.finish("default", 2);
    if (v.is_undefined() || (boolean && !truthy(v))) return dflt;
    return v;
  };
  f["d"] = f["default"];
  f["length"] = [](Interpreter&, const Value& v, CallArgs& args) {
    args.finish("length", 0);
    return Value::integer(static_cast<int64_t>(length(v)));
  };
  f["count"] = f["length"];
  f["list"] = [](Interpreter&, const Value& v, CallArgs& args) {
    args.finish("list", 0);
    return Value::list(iterate(v));
  };
  f["join"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    Value d = args.take(0, "d").value_or(Value::string(""));
    auto attribute = args.take(1, "attribute");
    args.finish("join", 2);
    std::string sep = soft_str(d), out;
    bool first = true;
    for (const auto& item : iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += soft_str(attribute ? attr_lookup(ip, item, *attribute) : item);
      ip.check_size(out.size());
    }
    return Value::string(std::move(out));
  };
  f["first"] = [](Interpreter&, const Value& v, CallArgs& args) {
    args.finish("first", 0);
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined("No first item, sequence was empty.");
    return items.front();
  };
  f["last"] = [](Interpreter&, const Value& v, CallArgs& args) {
    args.finish("last", 0);
    if (!v.is_undefined() && !v.is_string() && !v.is_list() && !v.is_dict()) {
      eval_fail("'{}' object is not reversible", type_name(v));
    }
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined("No last item, sequence was empty.");
    return items.back();
  };
  f["reverse"] = [](Interpreter&, const Value& v, CallArgs& args) {
    args.finish("reverse", 0);
    if (v.is_string()) {
      std::u32string s = unicode::to_u32(v.str());
      std::reverse(s.begin(), s.end());
      return Value::string(unicode::from_u32(s));
    }
    if (v.is_object() && v.obj().is_iterator()) {
      std::vector<Value> items = iterate(v);
      std::reverse(items.begin(), items.end());
      return Value::list(std::move(items));
    }
    if (!v.is_undefined() && !v.is_list() && !v.is_dict()) eval_fail("argument must be iterable");
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    const char* kind = v.is_dict()    ? "dict_reversekeyiterator"
                       : v.is_tuple() ? "reversed"
                                      : "list_reverseiterator";
    return make_iterator(std::move(items), kind);
  };
  f["sort"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    bool reverse = arg_bool(args.take(0, "reverse"), false);
    bool case_sensitive = arg_bool(args.take(1, "case_sensitive"), false);
    auto attribute = args.take(2, "attribute");
    args.finish("sort", 3);
    std::vector<Value> attrs = split_attributes(attribute);
    std::vector<std::pair<std::vector<Value>, Value>> keyed;
    for (auto& item : iterate(v)) {
      std::vector<Value> key;
      for (const auto& a : attrs) {
        Value k = attr_lookup(ip, item, a);
        key.push_back(case_sensitive ? k : ignore_case(k));
      }
      keyed.emplace_back(std::move(key), std::move(item));
    }
    std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& a, const auto& b) {
      return reverse ? key_less(b.first, a.first) : key_less(a.first, b.first);
    });
    std::vector<Value> out;
    for (auto& kv : keyed) out.push_back(std::move(kv.second));
    return Value::list(std::move(out));
  };
  f["unique"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    bool case_sensitive = arg_bool(args.take(0, "case_sensitive"), false);
    auto attribute = args.take(1, "attribute");
    args.finish("unique", 2);
    std::vector<Value> seen, out;
    for (const auto& item : iterate(v)) {
      Value key = one_attr_getter(ip, item, attribute, !case_sensitive);
      check_hashable(key);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return make_iterator(std::move(out));
  };
  f["min"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    return min_max(ip, v, args, false);
  };
  f["max"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    return min_max(ip, v, args, true);
  };
  f["sum"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    auto attribute = args.take(0, "attribute");
    Value total = args.take(1, "start").value_or(Value::integer(0));
    args.finish("sum", 2);
    for (const auto& item : iterate(v)) {
      Value x = attribute && !attribute->is_none() ? attr_lookup(ip, item, *attribute) : item;
      total = binary_op(BinOp::kAdd, total, x, ip.limits().max_output_bytes);
    }
    return total;
  };
  f["map"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    if (!truthy(v)) return make_iterator({});
    std::vector<Value> out;
    auto attr_it = std::find_if(args.kw.begin(), args.kw.end(),
                                [](const auto& p) { return p.first == "attribute"; });
    if (args.pos.empty() && attr_it != args.kw.end()) {
      Value attribute = attr_it->second, dflt = Value::none();
      for (const auto& [k, x] : args.kw) {
        if (k == "default")
          dflt = x;
        else if (k != "attribute")
          eval_fail("Unexpected keyword argument '{}'", k);
      }
      for (const auto& item : iterate(v)) {
        Value x = attr_lookup(ip, item, attribute);
        if (!dflt.is_none() && x.is_undefined()) x = dflt;
        out.push_back(x);
      }
      return make_iterator(std::move(out));
    }
    if (args.pos.empty()) eval_fail("map requires a filter argument");
    if (!args.pos[0].is_string()) eval_fail("map filter name must be a string");
    std::string name = args.pos[0].str();
    CallArgs rest;
    rest.pos.assign(args.pos.begin() + 1, args.pos.end());
    rest.kw = args.kw;
    for (const auto& item : iterate(v)) {
      CallArgs a = rest;
      out.push_back(ip.apply_filter(name, item, a));
    }
    return make_iterator(std::move(out));
  };
  f["select"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    return select_or_reject(ip, v, args, true, false);
  };
  f["reject"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    return select_or_reject(ip, v, args, false, false);
  };
  f["selectattr"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    return select_or_reject(ip, v, args, true, true);
  };
  f["rejectattr"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    return select_or_reject(ip, v, args, false, true);
  };
  f["items"] = [](Interpreter&, const Value& v, CallArgs& args) {
    args.finish("items", 0);
    if (v.is_undefined()) return make_iterator({});
    if (!v.is_dict()) eval_fail("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& [k, x] : v.dict().entries) out.push_back(Value::tuple({k, x}));
    return make_iterator(std::move(out));
  };
  f["dictsort"] = [](Interpreter&, const Value& v, CallArgs& args) {
    bool case_sensitive = arg_bool(args.take(0, "case_sensitive"), false);
    Value by = args.take(1, "by").value_or(Value::string("key"));
    bool reverse = arg_bool(args.take(2, "reverse"), false);
    args.finish("dictsort", 3);
    size_t pos;
    if (by.is_string() && by.str() == "key")
      pos = 0;
    else if (by.is_string() && by.str() == "value")
      pos = 1;
    else
      eval_fail("You can only sort by either \"key\" or \"value\"");
    if (v.is_undefined()) undefined_fail(v);
    if (!v.is_dict()) eval_fail("'{}' object has no attribute 'items'", type_name(v));
    std::vector<std::pair<Value, Value>> items(v.dict().entries.begin(), v.dict().entries.end());
    auto key = [&](const std::pair<Value, Value>& kv) {
      const Value& x = pos == 0 ? kv.first : kv.second;
      return case_sensitive ? x : ignore_case(x);
    };
    std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) {
      return reverse ? less(key(b), key(a)) : less(key(a), key(b));
    });
    std::vector<Value> out;
    for (auto& [k, x] : items) out.push_back(Value::tuple({k, x}));
    return Value::list(std::move(out));
  };
  f["groupby"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    auto attribute = args.take(0, "attribute");
    Value dflt = args.take(1, "default").value_or(Value::none());
    bool case_sensitive = arg_bool(args.take(2, "case_sensitive"), false);
    args.finish("groupby", 3);
    if (!attribute) eval_fail("groupby() missing required argument 'attribute'");
    auto getter = [&](const Value& item, bool fold) {
      Value x = attr_lookup(ip, item, *attribute);
      if (!dflt.is_none() && x.is_undefined()) x = dflt;
      return fold ? ignore_case(x) : x;
    };
    std::vector<std::pair<Value, Value>> keyed;
    for (auto& item : iterate(v)) keyed.emplace_back(getter(item, !case_sensitive), item);
    std::stable_sort(keyed.begin(), keyed.end(),
                     [](const auto& a, const auto& b) { return less(a.first, b.first); });
    std::vector<Value> groups;
    for (size_t i = 0; i < keyed.size();) {
      size_t j = i;
      std::vector<Value> members;
      while (j < keyed.size() && equal(keyed[j].first, keyed[i].first))
        members.push_back(keyed[j++].second);
      Value grouper = case_sensitive ? keyed[i].first : getter(members.front(), false);
      groups.push_back(Value::list({grouper, Value::list(std::move(members))}, ListKind::kGroup));
      i = j;
    }
    return Value::list(std::move(groups));
  };
  f["batch"] = [](Interpreter&, const Value& v, CallArgs& args) {
    int64_t n = arg_integer(args.take(0, "linecount"), 0, "batch");
    auto fill = args.take(1, "fill_with");
    args.finish("batch", 2);
    if (n <= 0) eval_fail("batch size must be positive");
    std::vector<Value> out, tmp;
    for (auto& item : iterate(v)) {
      if (static_cast<int64_t>(tmp.size()) == n) {
        out.push_back(Value::list(std::move(tmp)));
        tmp.clear();
      }
      tmp.push_back(std::move(item));
    }
    if (!tmp.empty()) {
      if (fill && !fill->is_none()) {
        while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(*fill);
      }
      out.push_back(Value::list(std::move(tmp)));
    }
    return make_iterator(std::move(out));
  };
  f["slice"] = [](Interpreter&, const Value& v, CallArgs& args) {
    int64_t slices = arg_integer(args.take(0, "slices"), 0, "slice");
    auto fill = args.take(1, "fill_with");
    args.finish("slice", 2);
    if (slices <= 0) eval_fail("integer division or modulo by zero");
    std::vector<Value> seq = iterate(v), out;
    int64_t len = static_cast<int64_t>(seq.size());
    int64_t per = len / slices, extra = len % slices, offset = 0;
    for (int64_t k = 0; k < slices; ++k) {
      int64_t start = offset + k * per;
      if (k < extra) ++offset;
      int64_t end = offset + (k + 1) * per;
      std::vector<Value> tmp(seq.begin() + start, seq.begin() + end);
      if (fill && !fill->is_none() && k >= extra) tmp.push_back(*fill);
      out.push_back(Value::list(std::move(tmp)));
    }
    return make_iterator(std::move(out));
  };
  f["attr"] = [](Interpreter&, const Value& v, CallArgs& args) {
    auto name = args.take(0, "name");
    args.finish("attr", 1);
    if (!name) eval_fail("attr() missing required argument 'name'");
    std::string n = soft_str(*name);
    if (v.is_undefined()) undefined_fail(v);
    if (v.is_object()) {
      if (auto x = v.obj().get_attr(n)) return *x;
    } else if (auto m = python_attribute(v, n)) {
      return *m;
    }
    return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_type_repr(v), n));
  };
}

}  // namespace atom::jinja
