#include "jinja/py_ops.h"

#include <climits>
#include <cmath>

#include "jinja/unicode.h"

namespace atom::jinja {

namespace {

[[noreturn]] void unsupported(const char* op, const Value& a, const Value& b) {
  eval_fail("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b));
}

void check_overflow(bool overflow) {
  if (overflow) eval_fail("integer overflow (atom's template integers are 64-bit)");
}

int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) eval_fail("integer division or modulo by zero");
  if (a == INT64_MIN && b == -1)
    eval_fail("integer overflow (atom's template integers are 64-bit)");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t py_mod(int64_t a, int64_t b) {
  if (b == 0) eval_fail("integer division or modulo by zero");
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// CPython's float_divmod, so floor division and modulo agree with Python for every sign.
std::pair<double, double> float_divmod(double vx, double wx) {
  if (wx == 0.0) eval_fail("float division by zero");
  double mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  double floordiv;
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
  return {floordiv, mod};
}

Value repeat(const Value& seq, int64_t n, size_t max_bytes) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const std::string& s = seq.str();
    if (!s.empty() && static_cast<uint64_t>(n) > max_bytes / s.size()) {
      eval_fail("string repetition exceeds the output limit of {} bytes", max_bytes);
    }
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value::string(std::move(out));
  }
  const auto& items = seq.list().items;
  if (!items.empty() && static_cast<uint64_t>(n) > (max_bytes / 8) / items.size()) {
    eval_fail("list repetition is too large");
  }
  std::vector<Value> out;
  out.reserve(items.size() * static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::list(std::move(out), base_kind(seq.list().kind));
}

bool is_seq(const Value& v) { return v.is_sequence(); }

Value int_pow(int64_t base, int64_t exp) {
  if (exp < 0) {
    if (base == 0) eval_fail("0.0 cannot be raised to a negative power");
    return Value::number(std::pow(double(base), double(exp)));
  }
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1) check_overflow(__builtin_mul_overflow(result, base, &result));
    exp >>= 1;
    if (exp > 0) check_overflow(__builtin_mul_overflow(base, base, &base));
  }
  return Value::integer(result);
}

}  // namespace

Value binary_op(BinOp op, const Value& a, const Value& b, size_t max_bytes) {
  if (a.is_undefined()) undefined_fail(a);
  if (b.is_undefined()) undefined_fail(b);
  bool ints = a.is_integral() && b.is_integral();
  bool nums = a.is_number() && b.is_number();
  switch (op) {
    case BinOp::kAdd: {
      int64_t r = 0;
      if (ints) {
        check_overflow(__builtin_add_overflow(a.as_int(), b.as_int(), &r));
        return Value::integer(r);
      }
      if (nums) return Value::number(a.as_double() + b.as_double());
      if (a.is_string() && b.is_string()) {
        if (a.str().size() + b.str().size() > max_bytes) {
          eval_fail("string exceeds the output limit of {} bytes", max_bytes);
        }
        std::string s;
        s.reserve(a.str().size() + b.str().size());
        s += a.str();
        s += b.str();
        return Value::string(std::move(s));
      }
      if (is_seq(a) && is_seq(b) && a.is_tuple() == b.is_tuple()) {
        std::vector<Value> items = a.list().items;
        items.insert(items.end(), b.list().items.begin(), b.list().items.end());
        return Value::list(std::move(items), base_kind(a.list().kind));
      }
      if (a.is_string()) eval_fail("can only concatenate str (not \"{}\") to str", type_name(b));
      if (a.is_plain_list())
        eval_fail("can only concatenate list (not \"{}\") to list", type_name(b));
      if (a.is_tuple()) eval_fail("can only concatenate tuple (not \"{}\") to tuple", type_name(b));
      unsupported("+", a, b);
    }
    case BinOp::kSub: {
      int64_t r = 0;
      if (ints) {
        check_overflow(__builtin_sub_overflow(a.as_int(), b.as_int(), &r));
        return Value::integer(r);
      }
      if (nums) return Value::number(a.as_double() - b.as_double());
      unsupported("-", a, b);
    }
    case BinOp::kMul: {
      int64_t r = 0;
      if (ints) {
        check_overflow(__builtin_mul_overflow(a.as_int(), b.as_int(), &r));
        return Value::integer(r);
      }
      if (nums) return Value::number(a.as_double() * b.as_double());
      if ((a.is_string() || is_seq(a)) && b.is_integral()) return repeat(a, b.as_int(), max_bytes);
      if ((b.is_string() || is_seq(b)) && a.is_integral()) return repeat(b, a.as_int(), max_bytes);
      if (a.is_string() || b.is_string()) {
        eval_fail("can't multiply sequence by non-int of type '{}'",
                  type_name(a.is_string() ? b : a));
      }
      unsupported("*", a, b);
    }
    case BinOp::kDiv:
      if (nums) {
        if (b.as_double() == 0.0) eval_fail("division by zero");
        return Value::number(a.as_double() / b.as_double());
      }
      unsupported("/", a, b);
    case BinOp::kFloorDiv:
      if (ints) return Value::integer(floor_div(a.as_int(), b.as_int()));
      if (nums) return Value::number(float_divmod(a.as_double(), b.as_double()).first);
      unsupported("//", a, b);
    case BinOp::kMod:
      if (ints) return Value::integer(py_mod(a.as_int(), b.as_int()));
      if (nums) {
        if (b.as_double() == 0.0) eval_fail("float modulo");
        return Value::number(float_divmod(a.as_double(), b.as_double()).second);
      }
      if (a.is_string()) return Value::string(percent_format(a.str(), b));
      unsupported("%", a, b);
    case BinOp::kPow:
      if (ints) return int_pow(a.as_int(), b.as_int());
      if (nums) {
        double x = a.as_double(), y = b.as_double();
        if (x == 0.0 && y < 0) eval_fail("0.0 cannot be raised to a negative power");
        if (x < 0 && y != std::floor(y)) {
          eval_fail("a negative number raised to a fractional power is complex (not supported)");
        }
        return Value::number(std::pow(x, y));
      }
      unsupported("** or pow()", a, b);
  }
  eval_fail("unknown operator");
}

Value unary_op(char op, const Value& x) {
  if (x.is_undefined()) undefined_fail(x);
  if (x.is_integral()) {
    if (op == '+') return Value::integer(x.as_int());
    if (x.as_int() == INT64_MIN)
      eval_fail("integer overflow (atom's template integers are 64-bit)");
    return Value::integer(-x.as_int());
  }
  if (x.is_float()) return Value::number(op == '-' ? -x.as_double() : x.as_double());
  eval_fail("bad operand type for unary {}: '{}'", op, type_name(x));
}

bool contains(const Value& container, const Value& item) {
  switch (container.type()) {
    case Value::Type::kUndefined:
      return false;
    case Value::Type::kString:
      if (!item.is_string()) {
        eval_fail("'in <string>' requires string as left operand, not {}", type_name(item));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Type::kList:
      for (const auto& x : container.list().items) {
        if (equal(x, item)) return true;
      }
      return false;
    case Value::Type::kDict:
      check_hashable(item);
      return container.dict().find(item) != nullptr;
    case Value::Type::kObject:
      if (container.obj().is_iterator()) {
        for (const auto& x : container.obj().drain()) {
          if (equal(x, item)) return true;
        }
        return false;
      }
      [[fallthrough]];
    default:
      eval_fail("argument of type '{}' is not iterable", type_name(container));
  }
}

int64_t to_index(const Value& v, const char* what) {
  if (!v.is_integral()) eval_fail("{} must be integers or None, not {}", what, type_name(v));
  return v.as_int();
}

Value slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) undefined_fail(obj);
  if (obj.is_dict()) eval_fail("unhashable type: 'slice'");
  if (!obj.is_string() && !is_seq(obj))
    eval_fail("'{}' object is not subscriptable", type_name(obj));
  for (const Value* v : {&start_v, &stop_v, &step_v}) {
    if (!v->is_none() && !v->is_integral()) {
      eval_fail("slice indices must be integers or None or have an __index__ method");
    }
  }
  int64_t step = step_v.is_none() ? 1 : step_v.as_int();
  if (step == 0) eval_fail("slice step cannot be zero");
  std::u32string chars;
  int64_t len;
  if (obj.is_string()) {
    chars = unicode::to_u32(obj.str());
    len = static_cast<int64_t>(chars.size());
  } else {
    len = static_cast<int64_t>(obj.list().items.size());
  }
  // slice.indices()
  auto clamp = [&](const Value& v, int64_t dflt) {
    if (v.is_none()) return dflt;
    int64_t i = v.as_int();
    if (i < 0) {
      i += len;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= len) {
      i = step < 0 ? len - 1 : len;
    }
    return i;
  };
  int64_t start = clamp(start_v, step < 0 ? len - 1 : 0);
  int64_t stop = clamp(stop_v, step < 0 ? -1 : len);
  std::vector<size_t> idx;
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) idx.push_back(static_cast<size_t>(i));
  } else {
    for (int64_t i = start; i > stop; i += step) idx.push_back(static_cast<size_t>(i));
  }
  if (obj.is_string()) {
    std::u32string out;
    out.reserve(idx.size());
    for (size_t i : idx) out += chars[i];
    return Value::string(unicode::from_u32(out));
  }
  std::vector<Value> out;
  out.reserve(idx.size());
  for (size_t i : idx) out.push_back(obj.list().items[i]);
  return Value::list(std::move(out), base_kind(obj.list().kind));
}

std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  std::string t = type_name(v);
  if (v.is_object()) {
    if (t == "Namespace") return "jinja2.utils.Namespace object";
    if (t == "LoopContext") return "jinja2.runtime.LoopContext object";
  }
  return t + " object";
}

}  // namespace atom::jinja
