// The values a template computes with, and their Python semantics. jinja2 evaluates templates as
// Python, so a faithful renderer needs Python's types: int vs float, str as code points, tuples,
// dict insertion order, None vs jinja2's Undefined, and generators that are truthy even when empty
// and can be iterated only once.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "jinja/error.h"

namespace atom::jinja {

class Value;
class Object;
class Interpreter;

// Thrown by value operations, which do not know where in the template they run; the renderer
// turns it into a TemplateError carrying the line being evaluated.
struct EvalError {
  TemplateError::Kind kind;
  std::string message;
};

template <typename... Args>
[[noreturn]] void eval_fail(fmt::format_string<Args...> f, Args&&... args) {
  throw EvalError{TemplateError::Kind::kRuntime, fmt::format(f, std::forward<Args>(args)...)};
}

// Python's list, tuple and the dict views share one representation; the kind keeps what differs
// (repr, equality, indexing).
enum class ListKind : uint8_t { kList, kTuple, kDictKeys, kDictValues, kDictItems, kGroup };

// groupby's (grouper, list) named tuple behaves as a tuple everywhere but attribute lookup.
inline ListKind base_kind(ListKind k) { return k == ListKind::kGroup ? ListKind::kTuple : k; }

struct ListData {
  std::vector<Value> items;
  ListKind kind = ListKind::kList;
};

// An insertion-ordered dict. Chat-template dicts are small (a message, a JSON schema), so lookup
// is a linear scan, which also keeps Python's key equality (1 == 1.0 == True) simple.
struct DictData {
  std::vector<std::pair<Value, Value>> entries;

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Inserts or replaces, keeping the first insertion position as Python does.
  void set(Value key, Value value);
};

using StrPtr = std::shared_ptr<const std::string>;
using ListPtr = std::shared_ptr<const ListData>;
using DictPtr = std::shared_ptr<const DictData>;
using ObjPtr = std::shared_ptr<Object>;

// jinja2's default Undefined: prints as "", is falsy, iterates as empty, and raises when used in
// any other way. The hint says why it is undefined, for that error.
struct Undefined {
  StrPtr hint;
};

class Value {
 public:
  enum class Type : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kObject
  };

  Value() : v_(Undefined{}) {}
  static Value undefined(std::string hint);
  static Value none() { return Value(Raw(nullptr)); }
  static Value boolean(bool b) { return Value(Raw(b)); }
  static Value integer(int64_t i) { return Value(Raw(i)); }
  static Value number(double d) { return Value(Raw(d)); }
  static Value string(std::string s) {
    return Value(Raw(std::make_shared<const std::string>(std::move(s))));
  }
  static Value string(StrPtr s) { return Value(Raw(std::move(s))); }
  static Value list(std::vector<Value> items, ListKind kind = ListKind::kList);
  static Value tuple(std::vector<Value> items) { return list(std::move(items), ListKind::kTuple); }
  static Value dict(DictData d) {
    return Value(Raw(std::make_shared<const DictData>(std::move(d))));
  }
  static Value object(ObjPtr o) { return Value(Raw(std::move(o))); }

  Type type() const { return static_cast<Type>(v_.index()); }
  bool is_undefined() const { return type() == Type::kUndefined; }
  bool is_none() const { return type() == Type::kNone; }
  bool is_bool() const { return type() == Type::kBool; }
  bool is_int() const { return type() == Type::kInt; }
  bool is_float() const { return type() == Type::kFloat; }
  // Python's numbers.Number: bool is an int subclass.
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  // An int for arithmetic: int or bool.
  bool is_integral() const { return is_bool() || is_int(); }
  bool is_string() const { return type() == Type::kString; }
  bool is_list() const { return type() == Type::kList; }
  bool is_dict() const { return type() == Type::kDict; }
  bool is_object() const { return type() == Type::kObject; }
  bool is_tuple() const { return is_list() && base_kind(list().kind) == ListKind::kTuple; }
  bool is_plain_list() const { return is_list() && list().kind == ListKind::kList; }
  // A list or a tuple (not a dict view).
  bool is_sequence() const { return is_plain_list() || is_tuple(); }

  bool as_bool() const { return std::get<bool>(v_); }
  // int or bool as int64.
  int64_t as_int() const { return is_bool() ? (as_bool() ? 1 : 0) : std::get<int64_t>(v_); }
  // Any number as double.
  double as_double() const { return is_float() ? std::get<double>(v_) : double(as_int()); }
  const std::string& str() const { return *std::get<StrPtr>(v_); }
  const StrPtr& str_ptr() const { return std::get<StrPtr>(v_); }
  const ListData& list() const { return *std::get<ListPtr>(v_); }
  const DictData& dict() const { return *std::get<DictPtr>(v_); }
  const ListPtr& list_ptr() const { return std::get<ListPtr>(v_); }
  const DictPtr& dict_ptr() const { return std::get<DictPtr>(v_); }
  Object& obj() const { return *std::get<ObjPtr>(v_); }
  const ObjPtr& obj_ptr() const { return std::get<ObjPtr>(v_); }
  // The reason an undefined value is undefined ("'x' is undefined").
  std::string undefined_hint() const;

 private:
  using Raw = std::variant<Undefined, std::nullptr_t, bool, int64_t, double, StrPtr, ListPtr,
                           DictPtr, ObjPtr>;
  explicit Value(Raw v) : v_(std::move(v)) {}
  Raw v_;
};

// Positional and keyword arguments of a call, as Python passes them.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;

  // Takes the named argument (keyword, or positional at `index`), or nullopt.
  std::optional<Value> take(size_t index, std::string_view name);
  // Errors if keyword arguments remain that nobody took, or too many positionals.
  void finish(std::string_view callee, size_t max_positional);

 private:
  std::vector<bool> taken_;
};

// Namespaces, loop contexts, callables and iterators: values with identity and behaviour.
class Object {
 public:
  virtual ~Object() = default;
  // Python's type name, for error messages and repr.
  virtual std::string type_name() const = 0;
  virtual std::string repr() const { return "<" + type_name() + " object>"; }
  virtual bool truthy() const { return true; }
  // len(obj); nullopt when the object has no length.
  virtual std::optional<size_t> len() const { return std::nullopt; }
  // getattr(obj, name); nullopt when there is no such attribute.
  virtual std::optional<Value> get_attr(const std::string& name) { return std::nullopt; }
  virtual bool callable() const { return false; }
  virtual Value call(Interpreter& ip, CallArgs& args);
  // Iterators (generators, reversed()) yield their remaining items once.
  virtual bool is_iterator() const { return false; }
  virtual std::vector<Value> drain();
  // jinja2 Namespace: the only object `{% set ns.attr = v %}` may assign to.
  virtual bool set_attr(const std::string& name, Value v) { return false; }
};

// A one-shot iterator over precomputed items: what Python's generators and reversed() give.
class IteratorObject : public Object {
 public:
  IteratorObject(std::vector<Value> items, std::string type_name)
      : items_(std::move(items)), type_name_(std::move(type_name)) {}
  std::string type_name() const override { return type_name_; }
  bool is_iterator() const override { return true; }
  std::vector<Value> drain() override;

 private:
  std::vector<Value> items_;
  size_t pos_ = 0;
  std::string type_name_;
};

Value make_iterator(std::vector<Value> items, std::string type_name = "generator");

// Bounds the recursion of functions that walk nested values (repr, ==, json.dumps, ...): a
// template can build lists nested a million deep, which would overflow the C++ stack. Python
// stops such values with a RecursionError at about the same depth.
class NestingGuard {
 public:
  static constexpr int kMaxDepth = 1000;
  NestingGuard() {
    if (++depth_ > kMaxDepth) {
      --depth_;
      eval_fail("value nested more than {} levels deep", kMaxDepth);
    }
  }
  ~NestingGuard() { --depth_; }
  NestingGuard(const NestingGuard&) = delete;
  NestingGuard& operator=(const NestingGuard&) = delete;

 private:
  static inline thread_local int depth_ = 0;
};

// ---- Python semantics (value.cpp) ----

std::string type_name(const Value& v);
bool truthy(const Value& v);
// Python ==; Undefined equals only Undefined.
bool equal(const Value& a, const Value& b);
// Python a < b; raises TypeError for unorderable types.
bool less(const Value& a, const Value& b);
// Python str() and repr().
std::string to_str(const Value& v);
std::string repr(const Value& v);
// len(); raises for values without a length.
size_t length(const Value& v);
// Iterates as Python's iter() does (dict → keys, str → characters, Undefined → nothing).
std::vector<Value> iterate(const Value& v);
bool is_iterable(const Value& v);
// Checks that v can be a dict key (Python hashable).
void check_hashable(const Value& v);
// Raises jinja2's UndefinedError for an undefined value used where a value is required.
[[noreturn]] void undefined_fail(const Value& v);

// Python float repr(): shortest round-trip digits, "1.0", "1e+16", "inf", "nan".
std::string float_repr(double d);
// Python repr() of a str.
std::string string_repr(std::string_view s);

}  // namespace atom::jinja
