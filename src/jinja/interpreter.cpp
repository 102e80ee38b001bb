#include "jinja/interpreter.h"

#include <pthread.h>

#include <algorithm>
#include <cstdint>

#include "jinja/methods.h"
#include "jinja/objects.h"
#include "jinja/py_ops.h"
#include "jinja/unicode.h"

namespace atom::jinja {

Value make_function(std::string name, NativeFn fn) {
  return Value::object(std::make_shared<NativeFunction>(std::move(name), std::move(fn)));
}

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent_.get()) {
    for (const auto& [k, v] : s->vars_) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

void Scope::set(const std::string& name, Value v) {
  for (auto& [k, old] : vars_) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  vars_.emplace_back(name, std::move(v));
}

std::string Interpreter::render(const Body& body,
                                const std::vector<std::pair<std::string, Value>>& vars,
                                const std::string& where) {
  auto globals = std::make_shared<Scope>();
  for (const auto& [k, v] : rt_.globals) globals->set(k, v);
  auto context = std::make_shared<Scope>(globals);
  for (const auto& [k, v] : vars) context->set(k, v);
  auto root = std::make_shared<Scope>(context);
  // A macro keeps the scope it is defined in, which keeps the macro: the cycles are broken when the
  // render ends, however it ends (LeakSanitizer found them through tests/fuzz/fuzz_jinja, and, for
  // macros defined in inner scopes such as a loop's or another macro's, through JinjaSnippets'
  // "macro" under ASan): every scope a macro closes over is cleared.
  closures_ = {root, context, globals};
  struct BreakCycles {
    std::vector<ScopePtr>& scopes;
    ~BreakCycles() {
      for (auto& s : scopes) s->clear();
      scopes.clear();
    }
  } cycles{closures_};
  stack_floor_ = stack_floor();
  std::string out;
  try {
    exec(body, root, out);
  } catch (const EvalError& e) {
    throw TemplateError(e.kind, e.message, where,
                        e.kind == TemplateError::Kind::kRaised ? 0 : line_);
  }
  return out;
}

void Interpreter::step() {
  if (++steps_ > rt_.limits.max_steps) {
    eval_fail("the template ran more than {} steps (a runaway loop?)", rt_.limits.max_steps);
  }
}

Interpreter::Nest::Nest(Interpreter& ip) : ip(ip) {
  if (++ip.nesting_ > ip.rt_.limits.max_eval_depth) {
    --ip.nesting_;
    eval_fail("rendering nests deeper than the evaluation depth limit of {} (runaway recursion?)",
              ip.rt_.limits.max_eval_depth);
  }
  // The depth limit assumes frames of an uninstrumented build on a thread of the usual 8 MB stack;
  // a smaller stack (or ASan's larger frames) runs out first, so the stack itself is checked too.
  if (ip.stack_floor_ &&
      reinterpret_cast<uintptr_t>(__builtin_frame_address(0)) < ip.stack_floor_) {
    const int n = ip.nesting_--;
    eval_fail("rendering nests deeper than this thread's stack allows, after {} nested evaluations "
              "(before the evaluation depth limit of {}; runaway recursion?)",
              n, ip.rt_.limits.max_eval_depth);
  }
}

uintptr_t Interpreter::stack_floor() {
  // The lowest address this thread's stack may reach, plus room for what runs below the last
  // checked frame (filters, formatting, the error's unwinding); 0 when it cannot be told.
  constexpr uintptr_t kReserve = 256 << 10;
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return 0;
  void* low = nullptr;
  size_t size = 0;
  const int rc = pthread_attr_getstack(&attr, &low, &size);
  pthread_attr_destroy(&attr);
  if (rc != 0 || !low || size <= 2 * kReserve) return 0;
  return reinterpret_cast<uintptr_t>(low) + kReserve;
}

void Interpreter::check_size(size_t bytes) const {
  if (bytes > rt_.limits.max_output_bytes) {
    eval_fail("the template output exceeds the limit of {} bytes", rt_.limits.max_output_bytes);
  }
}

void Interpreter::append(std::string& out, std::string_view text) const {
  check_size(out.size() + text.size());
  out.append(text);
}

Interpreter::Flow Interpreter::exec(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const auto& st : body) {
    Flow f = exec_stmt(*st, scope, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

std::string Interpreter::render_body(const Body& body, const ScopePtr& scope) {
  std::string out;
  exec(body, scope, out);
  return out;
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& st, const ScopePtr& scope, std::string& out) {
  Nest nest(*this);
  step();
  line_ = st.line;
  switch (st.kind) {
    case StmtKind::kData:
      append(out, static_cast<const DataStmt&>(st).text);
      return Flow::kNormal;
    case StmtKind::kOutput:
      for (const auto& e : static_cast<const OutputStmt&>(st).exprs) {
        Value v = eval(*e, *scope);
        if (v.is_string())
          append(out, v.str());
        else
          append(out, to_str(v));
      }
      return Flow::kNormal;
    case StmtKind::kIf: {
      const auto& n = static_cast<const IfStmt&>(st);
      for (const auto& [test, body] : n.branches) {
        if (truthy(eval(*test, *scope))) return exec(body, scope, out);
      }
      return exec(n.otherwise, scope, out);
    }
    case StmtKind::kFor:
      return exec_for(static_cast<const ForStmt&>(st), scope, out, std::nullopt, 0);
    case StmtKind::kSet: {
      const auto& n = static_cast<const SetStmt&>(st);
      assign(n.target, eval(*n.value, *scope), *scope);
      return Flow::kNormal;
    }
    case StmtKind::kSetBlock: {
      const auto& n = static_cast<const SetBlockStmt&>(st);
      auto inner = std::make_shared<Scope>(scope);
      Value v = Value::string(render_body(n.body, inner));
      if (n.filter) v = eval_filter(static_cast<const FilterExpr&>(*n.filter), *inner, &v);
      assign(n.target, v, *scope);
      return Flow::kNormal;
    }
    case StmtKind::kMacro: {
      const auto& n = static_cast<const MacroStmt&>(st);
      closures_.push_back(scope);
      scope->set(n.def->name, Value::object(std::make_shared<MacroObject>(n.def, scope)));
      return Flow::kNormal;
    }
    case StmtKind::kCallBlock: {
      const auto& n = static_cast<const CallBlockStmt&>(st);
      closures_.push_back(scope);
      Value caller = Value::object(std::make_shared<MacroObject>(n.caller, scope));
      append(out, to_str(eval_call(*n.call, *scope, caller)));
      return Flow::kNormal;
    }
    case StmtKind::kFilterBlock: {
      const auto& n = static_cast<const FilterBlockStmt&>(st);
      auto inner = std::make_shared<Scope>(scope);
      Value body = Value::string(render_body(n.body, inner));
      append(out, to_str(eval_filter(static_cast<const FilterExpr&>(*n.filter), *inner, &body)));
      return Flow::kNormal;
    }
    case StmtKind::kWith: {
      const auto& n = static_cast<const WithStmt&>(st);
      std::vector<Value> values;
      for (const auto& a : n.assigns) values.push_back(eval(*a.second, *scope));
      auto inner = std::make_shared<Scope>(scope);
      for (size_t i = 0; i < values.size(); ++i) assign(n.assigns[i].first, values[i], *inner);
      return exec(n.body, inner, out);
    }
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
    case StmtKind::kScope: {
      auto inner = std::make_shared<Scope>(scope);
      exec(static_cast<const ScopeStmt&>(st).body, inner, out);
      return Flow::kNormal;
    }
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec_for(const ForStmt& st, const ScopePtr& scope, std::string& out,
                                        std::optional<Value> iterable, int depth0) {
  if (depth0 >= rt_.limits.max_call_depth) {
    eval_fail("recursive loop nests deeper than {}", rt_.limits.max_call_depth);
  }
  std::vector<Value> items = iterate(iterable ? *iterable : eval(*st.iter, *scope));
  if (st.filter) {
    std::vector<Value> kept;
    for (auto& item : items) {
      step();
      auto probe = std::make_shared<Scope>(scope);
      assign(st.target, item, *probe);
      if (truthy(eval(*st.filter, *probe))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto inner = std::make_shared<Scope>(scope);
    return exec(st.otherwise, inner, out);
  }
  auto loop = std::make_shared<LoopObject>(std::move(items), depth0);
  if (st.recursive) {
    // loop(children) renders this loop again over `children`, one level deeper.
    loop->set_recurse([this, &st, scope, depth0](const Value& children) {
      std::string inner;
      exec_for(st, scope, inner, children, depth0 + 1);
      return Value::string(std::move(inner));
    });
  }
  Value loop_value = Value::object(loop);
  // As jinja2 compiles it, `else` runs unless some iteration reached the end of the body: a
  // break or continue in every iteration still runs it.
  bool completed = false;
  for (size_t i = 0; i < loop->size(); ++i) {
    step();
    loop->set_index(i);
    auto iteration = std::make_shared<Scope>(scope);
    iteration->set("loop", loop_value);
    assign(st.target, loop->item(i), *iteration);
    Flow f = exec(st.body, iteration, out);
    if (f == Flow::kBreak) break;
    if (f == Flow::kNormal) completed = true;
  }
  if (!completed) {
    auto inner = std::make_shared<Scope>(scope);
    return exec(st.otherwise, inner, out);
  }
  return Flow::kNormal;
}

void Interpreter::assign(const Target& target, const Value& value, Scope& scope) {
  switch (target.kind) {
    case Target::Kind::kName:
      scope.set(target.name, value);
      return;
    case Target::Kind::kNsAttr: {
      const Value* ns = scope.find(target.name);
      if (!ns || !ns->is_object() || !ns->obj().set_attr(target.attr, value)) {
        line_ = target.line;
        eval_fail("cannot assign attribute on non-namespace object");
      }
      return;
    }
    case Target::Kind::kTuple: {
      std::vector<Value> items = iterate(value);
      size_t want = target.items.size();
      if (items.size() < want) {
        eval_fail("not enough values to unpack (expected {}, got {})", want, items.size());
      }
      if (items.size() > want) eval_fail("too many values to unpack (expected {})", want);
      for (size_t i = 0; i < want; ++i) assign(target.items[i], items[i], scope);
      return;
    }
  }
}

Value Interpreter::eval(const Expr& e, Scope& scope) {
  Nest nest(*this);
  line_ = e.line;
  switch (e.kind) {
    case ExprKind::kConst:
      return static_cast<const ConstExpr&>(e).value;
    case ExprKind::kName: {
      const auto& n = static_cast<const NameExpr&>(e);
      if (const Value* v = scope.find(n.name)) return *v;
      return Value::undefined(fmt::format("'{}' is undefined", n.name));
    }
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      for (const auto& x : static_cast<const SeqExpr&>(e).items) items.push_back(eval(*x, scope));
      return Value::list(std::move(items),
                         e.kind == ExprKind::kTuple ? ListKind::kTuple : ListKind::kList);
    }
    case ExprKind::kDict: {
      DictData d;
      for (const auto& [k, v] : static_cast<const DictExpr&>(e).items) {
        Value key = eval(*k, scope);
        check_hashable(key);
        d.set(std::move(key), eval(*v, scope));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::kGetattr: {
      const auto& n = static_cast<const GetattrExpr&>(e);
      Value obj = eval(*n.obj, scope);
      line_ = e.line;
      return getattr(obj, n.attr);
    }
    case ExprKind::kGetitem: {
      const auto& n = static_cast<const GetitemExpr&>(e);
      Value obj = eval(*n.obj, scope);
      if (n.key->kind == ExprKind::kSlice) {
        return eval_slice(obj, static_cast<const SliceExpr&>(*n.key), scope);
      }
      Value key = eval(*n.key, scope);
      line_ = e.line;
      return getitem(obj, key);
    }
    case ExprKind::kSlice:
      eval_fail("slice outside a subscript");
    case ExprKind::kUnary: {
      const auto& n = static_cast<const UnaryExpr&>(e);
      Value v = eval(*n.operand, scope);
      if (n.op == '!') return Value::boolean(!truthy(v));
      return unary_op(n.op, v);
    }
    case ExprKind::kBinary: {
      const auto& n = static_cast<const BinaryExpr&>(e);
      Value a = eval(*n.left, scope);
      Value b = eval(*n.right, scope);
      line_ = e.line;
      return binary_op(n.op, a, b, rt_.limits.max_output_bytes);
    }
    case ExprKind::kAnd: {
      const auto& n = static_cast<const LogicExpr&>(e);
      Value a = eval(*n.left, scope);
      return truthy(a) ? eval(*n.right, scope) : a;
    }
    case ExprKind::kOr: {
      const auto& n = static_cast<const LogicExpr&>(e);
      Value a = eval(*n.left, scope);
      return truthy(a) ? a : eval(*n.right, scope);
    }
    case ExprKind::kConcat: {
      std::string s;
      for (const auto& p : static_cast<const ConcatExpr&>(e).parts) {
        Value v = eval(*p, scope);
        s += v.is_string() ? v.str() : to_str(v);
        check_size(s.size());
      }
      return Value::string(std::move(s));
    }
    case ExprKind::kCompare:
      return eval_compare(static_cast<const CompareExpr&>(e), scope);
    case ExprKind::kCondExpr: {
      const auto& n = static_cast<const CondExpr&>(e);
      if (truthy(eval(*n.test, scope))) return eval(*n.then, scope);
      if (n.otherwise) return eval(*n.otherwise, scope);
      return Value::undefined(fmt::format(
          "the inline if-expression on line {} evaluated to false and no else section was defined.",
          e.line));
    }
    case ExprKind::kCall:
      return eval_call(static_cast<const CallExpr&>(e), scope);
    case ExprKind::kFilter:
      return eval_filter(static_cast<const FilterExpr&>(e), scope, nullptr);
    case ExprKind::kTest: {
      const auto& n = static_cast<const FilterExpr&>(e);
      Value input = eval(*n.input, scope);
      CallArgs args = eval_args(n.call, scope);
      line_ = e.line;
      if (n.unknown) eval_fail("No test named '{}' found.", n.name);
      return Value::boolean(apply_test(n.name, input, args));
    }
  }
  eval_fail("unknown expression");
}

Value Interpreter::eval_compare(const CompareExpr& e, Scope& scope) {
  Value left = eval(*e.first, scope);
  for (const auto& [op, expr] : e.ops) {
    Value right = eval(*expr, scope);
    line_ = e.line;
    bool r = false;
    switch (op) {
      case CmpOp::kEq:
        r = equal(left, right);
        break;
      case CmpOp::kNe:
        r = !equal(left, right);
        break;
      case CmpOp::kLt:
        r = less(left, right);
        break;
      case CmpOp::kLe:
        r = less(left, right) || equal(left, right);
        break;
      case CmpOp::kGt:
        r = less(right, left);
        break;
      case CmpOp::kGe:
        r = less(right, left) || equal(left, right);
        break;
      case CmpOp::kIn:
        r = contains(right, left);
        break;
      case CmpOp::kNotIn:
        r = !contains(right, left);
        break;
    }
    if (!r) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Interpreter::eval_slice(const Value& obj, const SliceExpr& s, Scope& scope) {
  auto part = [&](const ExprPtr& x) { return x ? eval(*x, scope) : Value::none(); };
  Value start = part(s.start), stop = part(s.stop), stride = part(s.step);
  line_ = s.line;
  return slice(obj, start, stop, stride);
}

CallArgs Interpreter::eval_args(const CallSpec& spec, Scope& scope) {
  CallArgs args;
  for (const auto& a : spec.args) args.pos.push_back(eval(*a, scope));
  if (spec.dyn_args) {
    for (auto& v : iterate(eval(*spec.dyn_args, scope))) args.pos.push_back(std::move(v));
  }
  for (const auto& [k, v] : spec.kwargs) args.kw.emplace_back(k, eval(*v, scope));
  if (spec.dyn_kwargs) {
    Value d = eval(*spec.dyn_kwargs, scope);
    if (!d.is_dict()) eval_fail("argument after ** must be a mapping, not {}", type_name(d));
    for (const auto& [k, v] : d.dict().entries) {
      if (!k.is_string()) eval_fail("keywords must be strings");
      for (const auto& existing : args.kw) {
        if (existing.first == k.str())
          eval_fail("got multiple values for keyword argument '{}'", k.str());
      }
      args.kw.emplace_back(k.str(), v);
    }
  }
  return args;
}

Value Interpreter::eval_call(const CallExpr& e, Scope& scope, std::optional<Value> caller) {
  Value callee = eval(*e.callee, scope);
  CallArgs args = eval_args(e.call, scope);
  if (caller) args.kw.emplace_back("caller", std::move(*caller));
  line_ = e.line;
  return call(callee, args);
}

Value Interpreter::eval_filter(const FilterExpr& e, Scope& scope, const Value* block_input) {
  Value input;
  if (!e.input) {
    input = *block_input;
  } else if (block_input && e.input->kind == ExprKind::kFilter) {
    input = eval_filter(static_cast<const FilterExpr&>(*e.input), scope, block_input);
  } else {
    input = eval(*e.input, scope);
  }
  CallArgs args = eval_args(e.call, scope);
  line_ = e.line;
  if (e.unknown) eval_fail("No filter named '{}' found.", e.name);
  return apply_filter(e.name, input, args);
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) undefined_fail(callee);
  if (!callee.is_object() || !callee.obj().callable()) {
    eval_fail("'{}' object is not callable", type_name(callee));
  }
  return callee.obj().call(*this, args);
}

Value Interpreter::apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  auto it = rt_.filters.find(name);
  if (it == rt_.filters.end()) eval_fail("No filter named '{}'.", name);
  return it->second(*this, input, args);
}

bool Interpreter::apply_test(const std::string& name, const Value& input, CallArgs& args) {
  auto it = rt_.tests.find(name);
  if (it == rt_.tests.end()) eval_fail("No test named '{}'.", name);
  return it->second(*this, input, args);
}

Value Interpreter::getattr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_fail(obj);
  if (obj.is_object()) {
    if (auto v = obj.obj().get_attr(name)) return *v;
  } else {
    if (auto m = python_attribute(obj, name)) return *m;
    if (obj.is_dict()) {
      if (const Value* v = obj.dict().find(std::string_view(name))) return *v;
    }
  }
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_type_repr(obj), name));
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_fail(obj);
  if (obj.is_dict()) {
    if (!key.is_list() && !key.is_dict() && !key.is_object()) {
      if (const Value* v = obj.dict().find(key)) return *v;
    }
  } else if ((obj.is_plain_list() || obj.is_tuple()) && key.is_integral()) {
    int64_t n = static_cast<int64_t>(obj.list().items.size());
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i >= 0 && i < n) return obj.list().items[static_cast<size_t>(i)];
  } else if (obj.is_string() && key.is_integral()) {
    const std::string& s = obj.str();
    int64_t i = key.as_int();
    if (i < 0) i += static_cast<int64_t>(unicode::length(s));
    if (i >= 0) {
      size_t b = unicode::byte_offset(s, static_cast<size_t>(i));
      if (b < s.size()) {
        size_t e = b;
        unicode::decode(s, e);
        return Value::string(s.substr(b, e - b));
      }
    }
  }
  // jinja2 falls back to the attribute of that name for string keys.
  if (key.is_string()) {
    if (obj.is_object()) {
      if (auto v = obj.obj().get_attr(key.str())) return *v;
    } else if (auto m = python_attribute(obj, key.str())) {
      return *m;
    }
    return Value::undefined(
        fmt::format("'{}' has no attribute '{}'", object_type_repr(obj), key.str()));
  }
  return Value::undefined(fmt::format("{} has no element {}", object_type_repr(obj), repr(key)));
}

Value Interpreter::call_macro(const std::shared_ptr<const MacroDef>& def, const ScopePtr& closure,
                              CallArgs& args) {
  if (depth_ >= rt_.limits.max_call_depth) {
    eval_fail("macro calls nest deeper than {} (runaway recursion?)", rt_.limits.max_call_depth);
  }
  struct DepthGuard {
    int& d;
    explicit DepthGuard(int& x) : d(x) { ++d; }
    ~DepthGuard() { --d; }
  } guard(depth_);
  int call_line = line_;
  auto scope = std::make_shared<Scope>(closure);
  const auto& params = def->params;
  size_t np = params.size();
  size_t npos = std::min(args.pos.size(), np);
  std::vector<std::optional<Value>> values(np);
  for (size_t i = 0; i < npos; ++i) values[i] = args.pos[i];
  auto kw = args.kw;
  bool found_caller = std::find(params.begin(), params.end(), "caller") != params.end();
  if (npos != np) {
    found_caller = false;
    for (size_t i = npos; i < np; ++i) {
      auto it =
          std::find_if(kw.begin(), kw.end(), [&](const auto& p) { return p.first == params[i]; });
      if (it != kw.end()) {
        values[i] = it->second;
        kw.erase(it);
      }
      if (params[i] == "caller") found_caller = true;
    }
  }
  if (def->uses_caller && !found_caller) {
    auto it = std::find_if(kw.begin(), kw.end(), [](const auto& p) { return p.first == "caller"; });
    if (it != kw.end()) {
      scope->set("caller", it->second);
      kw.erase(it);
    } else {
      scope->set("caller", Value::undefined("No caller defined"));
    }
  }
  if (def->uses_kwargs) {
    DictData d;
    for (auto& [k, v] : kw) d.set(Value::string(k), v);
    scope->set("kwargs", Value::dict(std::move(d)));
  } else if (!kw.empty()) {
    for (const auto& p : kw) {
      if (p.first == "caller") {
        eval_fail(
            "macro '{}' was invoked with two values for the special caller argument. This is most "
            "likely a bug.",
            def->name);
      }
    }
    eval_fail("macro '{}' takes no keyword argument '{}'", def->name, kw.front().first);
  }
  if (def->uses_varargs) {
    std::vector<Value> extra;
    for (size_t i = np; i < args.pos.size(); ++i) extra.push_back(args.pos[i]);
    scope->set("varargs", Value::tuple(std::move(extra)));
  } else if (args.pos.size() > np) {
    eval_fail("macro '{}' takes not more than {} argument(s)", def->name, np);
  }
  size_t first_default = np - def->defaults.size();
  for (size_t i = 0; i < np; ++i) {
    if (values[i]) {
      scope->set(params[i], *values[i]);
    } else if (i >= first_default) {
      scope->set(params[i], eval(*def->defaults[i - first_default], *scope));
    } else {
      scope->set(params[i],
                 Value::undefined(fmt::format("parameter '{}' was not provided", params[i])));
    }
  }
  std::string out = render_body(def->body, scope);
  line_ = call_line;
  return Value::string(std::move(out));
}

}  // namespace atom::jinja
