// Walks the AST and renders output with jinja2's runtime semantics: lexical scopes (a for-loop
// iteration, a macro call and block tags get their own; if does not), late-bound macro closures,
// the sandbox's attribute and item lookup, and guards against runaway templates.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "jinja/ast.h"
#include "jinja/value.h"

namespace atom::jinja {

class Interpreter;

using FilterFn = std::function<Value(Interpreter& ip, const Value& input, CallArgs& args)>;
using TestFn = std::function<bool(Interpreter& ip, const Value& input, CallArgs& args)>;
using NativeFn = std::function<Value(Interpreter& ip, CallArgs& args)>;

// A function implemented in C++: globals (range, namespace), bound methods ("a b".split).
class NativeFunction : public Object {
 public:
  NativeFunction(std::string name, NativeFn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string type_name() const override { return "builtin_function_or_method"; }
  std::string repr() const override { return "<built-in function " + name_ + ">"; }
  bool callable() const override { return true; }
  Value call(Interpreter& ip, CallArgs& args) override { return fn_(ip, args); }

 private:
  std::string name_;
  NativeFn fn_;
};

Value make_function(std::string name, NativeFn fn);

struct Limits {
  size_t max_output_bytes = size_t{64} << 20;  // also caps any single string the template builds
  int max_call_depth = 256;                    // nested macro / caller invocations
  uint64_t max_steps = 50'000'000;             // statements and loop iterations executed
  // Nesting of the template source: blocks, brackets, and the links of chains such as a.b.c,
  // x|f|g or 1 + 2 + 3 (each link nests the tree one level). Checked while parsing.
  int max_depth = 256;
  // Nested evaluations while rendering (expressions, statements and macro calls together), which
  // bounds the native stack a render uses: deep trees in macros that recurse multiply.
  int max_eval_depth = 4096;
};

// What an environment provides to the interpreter: filters, tests, globals and limits.
struct Runtime {
  std::unordered_map<std::string, FilterFn> filters;
  std::unordered_map<std::string, TestFn> tests;
  std::vector<std::pair<std::string, Value>> globals;
  Limits limits;
};

// Variables visible at one point of a template. Lookups walk outwards to the globals.
class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent = nullptr) : parent_(std::move(parent)) {}
  const Value* find(const std::string& name) const;
  void set(const std::string& name, Value v);
  void clear() { vars_.clear(); }

 private:
  std::shared_ptr<Scope> parent_;
  std::vector<std::pair<std::string, Value>> vars_;
};
using ScopePtr = std::shared_ptr<Scope>;

class Interpreter {
 public:
  explicit Interpreter(const Runtime& rt) : rt_(rt) {}

  // Renders a template body with the given top-level variables; throws TemplateError.
  std::string render(const Body& body, const std::vector<std::pair<std::string, Value>>& vars,
                     const std::string& where);

  // ---- services for filters, tests and callables ----
  Value call(const Value& callee, CallArgs& args);
  Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
  bool apply_test(const std::string& name, const Value& input, CallArgs& args);
  bool has_filter(const std::string& name) const { return rt_.filters.count(name) > 0; }
  bool has_test(const std::string& name) const { return rt_.tests.count(name) > 0; }
  // The sandboxed environment's obj.attr and obj[key].
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  // Raises when a string the template builds would exceed the output limit.
  void check_size(size_t bytes) const;
  const Limits& limits() const { return rt_.limits; }

  // A macro (or a call block's caller) bound to the scope it was defined in.
  Value call_macro(const std::shared_ptr<const MacroDef>& def, const ScopePtr& closure,
                   CallArgs& args);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec(const Body& body, const ScopePtr& scope, std::string& out);
  Flow exec_stmt(const Stmt& st, const ScopePtr& scope, std::string& out);
  Flow exec_for(const ForStmt& st, const ScopePtr& scope, std::string& out,
                std::optional<Value> iterable, int depth0);
  void assign(const Target& target, const Value& value, Scope& scope);
  std::string render_body(const Body& body, const ScopePtr& scope);

  Value eval(const Expr& e, Scope& scope);
  Value eval_call(const CallExpr& e, Scope& scope, std::optional<Value> caller = std::nullopt);
  CallArgs eval_args(const CallSpec& spec, Scope& scope);
  Value eval_filter(const FilterExpr& e, Scope& scope, const Value* block_input);
  Value eval_compare(const CompareExpr& e, Scope& scope);
  Value eval_slice(const Value& obj, const SliceExpr& s, Scope& scope);
  void step();
  // Counts one evaluation frame for Limits::max_eval_depth while it lives.
  struct Nest {
    explicit Nest(Interpreter& ip);
    ~Nest() { --ip.nesting_; }
    Interpreter& ip;
  };
  void append(std::string& out, std::string_view text) const;
  static uintptr_t stack_floor();

  const Runtime& rt_;
  std::vector<ScopePtr> closures_;  // scopes macros close over, cleared when the render ends
  uintptr_t stack_floor_ = 0;       // Nest fails below this frame address (0: unchecked)
  int line_ = 0;
  int depth_ = 0;
  int nesting_ = 0;  // eval / exec_stmt frames on the stack
  uint64_t steps_ = 0;
};

}  // namespace atom::jinja
