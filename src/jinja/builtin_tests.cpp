// jinja2's tests (`x is defined`, `x is divisibleby 3`, ...), with Python's type checks.
#include "jinja/builtins.h"
#include "jinja/methods.h"
#include "jinja/py_ops.h"
#include "jinja/unicode.h"

namespace atom::jinja {

namespace {

Value need_arg(CallArgs& args, const char* test, const char* name) {
  auto v = args.take(0, name);
  if (!v) eval_fail("{}() missing required argument '{}'", test, name);
  args.finish(test, 1);
  return *v;
}

bool compare_test(CmpOp op, const Value& a, const Value& b) {
  switch (op) {
    case CmpOp::kEq:
      return equal(a, b);
    case CmpOp::kNe:
      return !equal(a, b);
    case CmpOp::kLt:
      return less(a, b);
    case CmpOp::kLe:
      return less(a, b) || equal(a, b);
    case CmpOp::kGt:
      return less(b, a);
    case CmpOp::kGe:
      return less(b, a) || equal(a, b);
    default:
      return false;
  }
}

// Python's `is`: identity. Small ints and singletons are shared in CPython; other values are
// only identical when they are the same object.
bool same_object(const Value& a, const Value& b) {
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::kNone:
      return true;
    case Value::Type::kBool:
      return a.as_bool() == b.as_bool();
    case Value::Type::kInt:
      return a.as_int() == b.as_int() && a.as_int() >= -5 && a.as_int() <= 256;
    case Value::Type::kString:
      return a.str_ptr() == b.str_ptr();
    case Value::Type::kList:
      return a.list_ptr() == b.list_ptr();
    case Value::Type::kDict:
      return a.dict_ptr() == b.dict_ptr();
    case Value::Type::kObject:
      return a.obj_ptr() == b.obj_ptr();
    default:
      return false;
  }
}

}  // namespace

void register_builtin_tests(std::unordered_map<std::string, TestFn>& t) {
  auto simple = [](const char* name, bool (*fn)(const Value&)) {
    return [name, fn](Interpreter&, const Value& v, CallArgs& args) {
      args.finish(name, 0);
      return fn(v);
    };
  };
  t["defined"] = simple("defined", [](const Value& v) { return !v.is_undefined(); });
  t["undefined"] = simple("undefined", [](const Value& v) { return v.is_undefined(); });
  t["none"] = simple("none", [](const Value& v) { return v.is_none(); });
  t["boolean"] = simple("boolean", [](const Value& v) { return v.is_bool(); });
  t["true"] = simple("true", [](const Value& v) { return v.is_bool() && v.as_bool(); });
  t["false"] = simple("false", [](const Value& v) { return v.is_bool() && !v.as_bool(); });
  t["integer"] = simple("integer", [](const Value& v) { return v.is_int(); });
  t["float"] = simple("float", [](const Value& v) { return v.is_float(); });
  t["number"] = simple("number", [](const Value& v) { return v.is_number(); });
  t["string"] = simple("string", [](const Value& v) { return v.is_string(); });
  t["mapping"] = simple("mapping", [](const Value& v) { return v.is_dict(); });
  t["iterable"] = simple("iterable", [](const Value& v) {
    return is_iterable(v) || (v.is_object() && v.obj().type_name() == "LoopContext");
  });
  t["sequence"] = simple("sequence", [](const Value& v) {
    return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict();
  });
  t["callable"] = simple("callable", [](const Value& v) {
    return v.is_undefined() || (v.is_object() && v.obj().callable());
  });
  t["escaped"] = simple("escaped", [](const Value&) { return false; });
  t["lower"] = simple("lower", [](const Value& v) {
    std::u32string s = unicode::to_u32(to_str(v));
    bool cased = false;
    for (char32_t c : s) {
      if (unicode::is_upper(c) || unicode::is_title(c)) return false;
      cased = cased || unicode::is_lower(c);
    }
    return cased;
  });
  t["upper"] = simple("upper", [](const Value& v) {
    std::u32string s = unicode::to_u32(to_str(v));
    bool cased = false;
    for (char32_t c : s) {
      if (unicode::is_lower(c) || unicode::is_title(c)) return false;
      cased = cased || unicode::is_upper(c);
    }
    return cased;
  });
  t["odd"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    args.finish("odd", 0);
    return equal(binary_op(BinOp::kMod, v, Value::integer(2), ip.limits().max_output_bytes),
                 Value::integer(1));
  };
  t["even"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    args.finish("even", 0);
    return equal(binary_op(BinOp::kMod, v, Value::integer(2), ip.limits().max_output_bytes),
                 Value::integer(0));
  };
  t["divisibleby"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    Value n = need_arg(args, "divisibleby", "num");
    return equal(binary_op(BinOp::kMod, v, n, ip.limits().max_output_bytes), Value::integer(0));
  };
  t["in"] = [](Interpreter&, const Value& v, CallArgs& args) {
    return contains(need_arg(args, "in", "seq"), v);
  };
  t["sameas"] = [](Interpreter&, const Value& v, CallArgs& args) {
    return same_object(v, need_arg(args, "sameas", "other"));
  };
  t["filter"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    args.finish("filter", 0);
    return v.is_string() && ip.has_filter(v.str());
  };
  t["test"] = [](Interpreter& ip, const Value& v, CallArgs& args) {
    args.finish("test", 0);
    return v.is_string() && ip.has_test(v.str());
  };
  struct Cmp {
    const char* name;
    CmpOp op;
  };
  for (Cmp c : {Cmp{"==", CmpOp::kEq},
                {"eq", CmpOp::kEq},
                {"equalto", CmpOp::kEq},
                {"!=", CmpOp::kNe},
                {"ne", CmpOp::kNe},
                {">", CmpOp::kGt},
                {"gt", CmpOp::kGt},
                {"greaterthan", CmpOp::kGt},
                {">=", CmpOp::kGe},
                {"ge", CmpOp::kGe},
                {"<", CmpOp::kLt},
                {"lt", CmpOp::kLt},
                {"lessthan", CmpOp::kLt},
                {"<=", CmpOp::kLe},
                {"le", CmpOp::kLe}}) {
    t[c.name] = [c](Interpreter&, const Value& v, CallArgs& args) {
      return compare_test(c.op, v, need_arg(args, c.name, "other"));
    };
  }
}

}  // namespace atom::jinja
