#include "jinja/template.h"

#include "jinja/builtins.h"
#include "jinja/lexer.h"
#include "jinja/objects.h"
#include "jinja/parser.h"

namespace atom::jinja {

Environment::Environment(Options options) : options_(std::move(options)) {
  auto rt = std::make_shared<Runtime>();
  register_string_filters(rt->filters);
  register_sequence_filters(rt->filters);
  for (const auto& name : unsupported_filters()) {
    rt->filters[name] = [name](Interpreter&, const Value&, CallArgs&) -> Value {
      eval_fail("the '{}' filter is not supported by atom's template engine", name);
    };
  }
  register_builtin_tests(rt->tests);
  rt->globals = builtin_globals();
  rt->limits = options_.limits;
  runtime_ = std::move(rt);
}

Runtime& Environment::mutable_runtime() {
  // Templates already created keep the runtime they were parsed with.
  if (runtime_.use_count() > 1) runtime_ = std::make_shared<Runtime>(*runtime_);
  return *runtime_;
}

void Environment::set_filter(const std::string& name, FilterFn fn) {
  mutable_runtime().filters[name] = std::move(fn);
}

void Environment::set_test(const std::string& name, TestFn fn) {
  mutable_runtime().tests[name] = std::move(fn);
}

void Environment::set_global(const std::string& name, Value value) {
  auto& globals = mutable_runtime().globals;
  for (auto& [k, v] : globals) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  globals.emplace_back(name, std::move(value));
}

Template Environment::from_string(std::string_view source, std::string name) const {
  LexerOptions lo;
  lo.trim_blocks = options_.trim_blocks;
  lo.lstrip_blocks = options_.lstrip_blocks;
  lo.keep_trailing_newline = options_.keep_trailing_newline;
  std::vector<Token> tokens = tokenize(source, lo, name);
  std::shared_ptr<const Runtime> rt = runtime_;
  ParserOptions po;
  po.has_filter = [rt](std::string_view n) { return rt->filters.count(std::string(n)) > 0; };
  po.has_test = [rt](std::string_view n) { return rt->tests.count(std::string(n)) > 0; };
  po.loop_controls = options_.loop_controls;
  po.scope_tags = options_.scope_tags;
  po.where = name;
  po.max_depth = options_.limits.max_depth;
  Template t;
  t.body_ = std::make_shared<const Body>(parse(tokens, po));
  t.runtime_ = std::move(rt);
  t.name_ = std::move(name);
  return t;
}

std::string Template::render(const std::vector<std::pair<std::string, Value>>& context) const {
  Interpreter ip(*runtime_);
  return ip.render(*body_, context, name_);
}

std::string Template::render(const nlohmann::ordered_json& context) const {
  std::vector<std::pair<std::string, Value>> vars;
  if (!context.is_null()) {
    if (!context.is_object()) {
      throw TemplateError(TemplateError::Kind::kRuntime,
                          "the template context must be a JSON object", name_, 0);
    }
    for (auto it = context.begin(); it != context.end(); ++it) {
      vars.emplace_back(it.key(), value_from_json(it.value()));
    }
  }
  return render(vars);
}

namespace {

Value from_json(const nlohmann::ordered_json& j) {
  NestingGuard guard;
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null:
      return Value::none();
    case T::boolean:
      return Value::boolean(j.get<bool>());
    case T::number_integer:
      return Value::integer(j.get<int64_t>());
    case T::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) {
        throw TemplateError(
            TemplateError::Kind::kRuntime,
            "integer " + std::to_string(u) + " is too large (atom's template integers are 64-bit)",
            "", 0);
      }
      return Value::integer(static_cast<int64_t>(u));
    }
    case T::number_float:
      return Value::number(j.get<double>());
    case T::string:
      return Value::string(j.get<std::string>());
    case T::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json(x));
      return Value::list(std::move(items));
    }
    case T::object: {
      DictData d;
      d.entries.reserve(j.size());
      // JSON object keys are unique, so entries can be appended without a lookup.
      for (auto it = j.begin(); it != j.end(); ++it) {
        d.entries.emplace_back(Value::string(it.key()), from_json(it.value()));
      }
      return Value::dict(std::move(d));
    }
    default:
      throw TemplateError(TemplateError::Kind::kRuntime,
                          "unsupported JSON value in template context", "", 0);
  }
}

}  // namespace

Value value_from_json(const nlohmann::ordered_json& j) {
  try {
    return from_json(j);
  } catch (const EvalError& e) {
    throw TemplateError(TemplateError::Kind::kRuntime, e.message, "template context", 0);
  }
}

}  // namespace atom::jinja
