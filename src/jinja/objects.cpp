#include "jinja/objects.h"

#include "jinja/py_ops.h"

namespace atom::jinja {

std::string LoopObject::repr() const {
  return fmt::format("<LoopContext {}/{}>", index0_ + 1, items_.size());
}

std::optional<Value> LoopObject::get_attr(const std::string& name) {
  int64_t i = static_cast<int64_t>(index0_);
  int64_t n = static_cast<int64_t>(items_.size());
  if (name == "index0") return Value::integer(i);
  if (name == "index") return Value::integer(i + 1);
  if (name == "revindex") return Value::integer(n - i);
  if (name == "revindex0") return Value::integer(n - i - 1);
  if (name == "first") return Value::boolean(i == 0);
  if (name == "last") return Value::boolean(i == n - 1);
  if (name == "length") return Value::integer(n);
  if (name == "depth") return Value::integer(depth0_ + 1);
  if (name == "depth0") return Value::integer(depth0_);
  if (name == "previtem") {
    if (i == 0) return Value::undefined("there is no previous item");
    return items_[index0_ - 1];
  }
  if (name == "nextitem") {
    if (i + 1 >= n) return Value::undefined("there is no next item");
    return items_[index0_ + 1];
  }
  auto self = shared_from_this();
  if (name == "cycle") {
    return make_function("cycle", [self](Interpreter&, CallArgs& args) -> Value {
      if (!args.kw.empty()) eval_fail("cycle() got an unexpected keyword argument");
      if (args.pos.empty()) eval_fail("no items for cycling given");
      return args.pos[self->index0_ % args.pos.size()];
    });
  }
  if (name == "changed") {
    return make_function("changed", [self](Interpreter&, CallArgs& args) -> Value {
      const auto& v = args.pos;
      bool same = self->last_changed_ && self->last_changed_->size() == v.size();
      for (size_t k = 0; same && k < v.size(); ++k) same = equal((*self->last_changed_)[k], v[k]);
      if (same) return Value::boolean(false);
      self->last_changed_ = v;
      return Value::boolean(true);
    });
  }
  return std::nullopt;
}

Value LoopObject::call(Interpreter& ip, CallArgs& args) {
  if (!recurse_) return Object::call(ip, args);
  if (args.pos.size() != 1 || !args.kw.empty()) eval_fail("loop() takes exactly one argument");
  return recurse_(args.pos[0]);
}

std::optional<Value> MacroObject::get_attr(const std::string& name) {
  if (name == "name") return Value::string(def_->name);
  if (name == "arguments") {
    std::vector<Value> names;
    for (const auto& p : def_->params) names.push_back(Value::string(p));
    return Value::tuple(std::move(names));
  }
  if (name == "catch_kwargs") return Value::boolean(def_->uses_kwargs);
  if (name == "catch_varargs") return Value::boolean(def_->uses_varargs);
  if (name == "caller") return Value::boolean(def_->uses_caller);
  return std::nullopt;
}

std::string NamespaceObject::repr() const {
  std::string out = "<Namespace ";
  out += jinja::repr(Value::dict(attrs_));
  out += '>';
  return out;
}

std::optional<Value> NamespaceObject::get_attr(const std::string& name) {
  if (const Value* v = attrs_.find(std::string_view(name))) return *v;
  return std::nullopt;
}

bool NamespaceObject::set_attr(const std::string& name, Value v) {
  attrs_.set(Value::string(name), std::move(v));
  return true;
}

namespace {

// dict(*args, **kwargs) as Python builds it.
DictData build_dict(const char* callee, CallArgs& args) {
  if (args.pos.size() > 1)
    eval_fail("{} expected at most 1 argument, got {}", callee, args.pos.size());
  DictData d;
  if (!args.pos.empty()) {
    const Value& src = args.pos[0];
    if (src.is_dict()) {
      d = src.dict();
    } else {
      for (const auto& item : iterate(src)) {
        std::vector<Value> pair = iterate(item);
        if (pair.size() != 2) {
          eval_fail("dictionary update sequence element has length {}; 2 is required", pair.size());
        }
        check_hashable(pair[0]);
        d.set(pair[0], pair[1]);
      }
    }
  }
  for (auto& [k, v] : args.kw) d.set(Value::string(k), v);
  return d;
}

class CyclerObject : public Object, public std::enable_shared_from_this<CyclerObject> {
 public:
  explicit CyclerObject(std::vector<Value> items) : items_(std::move(items)) {}
  std::string type_name() const override { return "Cycler"; }
  std::optional<Value> get_attr(const std::string& name) override {
    auto self = shared_from_this();
    if (name == "current") return items_[pos_];
    if (name == "items") return Value::tuple(items_);
    if (name == "next") {
      return make_function("next", [self](Interpreter&, CallArgs&) -> Value {
        Value v = self->items_[self->pos_];
        self->pos_ = (self->pos_ + 1) % self->items_.size();
        return v;
      });
    }
    if (name == "reset") {
      return make_function("reset", [self](Interpreter&, CallArgs&) -> Value {
        self->pos_ = 0;
        return Value::none();
      });
    }
    return std::nullopt;
  }

 private:
  std::vector<Value> items_;
  size_t pos_ = 0;
};

class JoinerObject : public Object {
 public:
  explicit JoinerObject(Value sep) : sep_(std::move(sep)) {}
  std::string type_name() const override { return "Joiner"; }
  bool callable() const override { return true; }
  Value call(Interpreter&, CallArgs&) override {
    if (!used_) {
      used_ = true;
      return Value::string("");
    }
    return sep_;
  }

 private:
  Value sep_;
  bool used_ = false;
};

Value range_fn(Interpreter&, CallArgs& args) {
  if (!args.kw.empty()) eval_fail("range() takes no keyword arguments");
  if (args.pos.empty() || args.pos.size() > 3) {
    eval_fail("range expected at most 3 arguments, got {}", args.pos.size());
  }
  std::vector<int64_t> n;
  for (const auto& v : args.pos) {
    if (!v.is_integral())
      eval_fail("'{}' object cannot be interpreted as an integer", type_name(v));
    n.push_back(v.as_int());
  }
  int64_t start = n.size() == 1 ? 0 : n[0];
  int64_t stop = n.size() == 1 ? n[0] : n[1];
  int64_t step = n.size() == 3 ? n[2] : 1;
  if (step == 0) eval_fail("range() arg 3 must not be zero");
  // The sandbox's MAX_RANGE.
  constexpr int64_t kMaxRange = 100000;
  int64_t count = 0;
  if (step > 0 && start < stop) count = (stop - start + step - 1) / step;
  if (step < 0 && start > stop) count = (start - stop - step - 1) / -step;
  if (count > kMaxRange) {
    eval_fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRange);
  }
  std::vector<Value> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out.push_back(Value::integer(start + i * step));
  return Value::list(std::move(out));
}

}  // namespace

std::vector<std::pair<std::string, Value>> builtin_globals() {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", make_function("range", range_fn));
  g.emplace_back("dict", make_function("dict", [](Interpreter&, CallArgs& args) {
                   return Value::dict(build_dict("dict", args));
                 }));
  g.emplace_back("namespace", make_function("namespace", [](Interpreter&, CallArgs& args) {
                   auto ns = std::make_shared<NamespaceObject>();
                   for (auto& [k, v] : build_dict("Namespace", args).entries) {
                     if (!k.is_string()) eval_fail("namespace attribute names must be strings");
                     ns->set_attr(k.str(), v);
                   }
                   return Value::object(ns);
                 }));
  g.emplace_back("cycler", make_function("cycler", [](Interpreter&, CallArgs& args) {
                   if (args.pos.empty()) eval_fail("at least one item has to be provided");
                   return Value::object(std::make_shared<CyclerObject>(args.pos));
                 }));
  g.emplace_back(
      "joiner", make_function("joiner", [](Interpreter&, CallArgs& args) {
        auto sep = args.take(0, "sep");
        args.finish("joiner", 1);
        return Value::object(std::make_shared<JoinerObject>(sep ? *sep : Value::string(", ")));
      }));
  return g;
}

}  // namespace atom::jinja
