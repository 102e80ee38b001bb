// atom::jinja: a Jinja2 template engine that renders templates byte for byte as Python's jinja2
// (3.1, in an ImmutableSandboxedEnvironment) does. Generic: it knows nothing about chat models.
//
//   jinja::Options o;
//   o.trim_blocks = o.lstrip_blocks = o.loop_controls = true;
//   jinja::Environment env(o);
//   env.set_global("greet", jinja::make_function("greet", ...));
//   jinja::Template t = env.from_string("{{ x | upper }}");
//   std::string s = t.render(nlohmann::ordered_json{{"x", "hi"}});   // "HI"
//
// Errors (syntax, runtime, raised by the template) are TemplateError, an atom::Error.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/ast.h"
#include "jinja/error.h"
#include "jinja/interpreter.h"
#include "jinja/value.h"

namespace atom::jinja {

struct Options {
  bool trim_blocks = false;
  bool lstrip_blocks = false;
  bool keep_trailing_newline = false;
  bool loop_controls = false;           // jinja2.ext.loopcontrols: {% break %}, {% continue %}
  std::vector<std::string> scope_tags;  // extension tags whose body renders in place
  Limits limits;
};

class Template;

class Environment {
 public:
  explicit Environment(Options options = {});

  // Adds or replaces a filter, test or global variable of templates created afterwards.
  void set_filter(const std::string& name, FilterFn fn);
  void set_test(const std::string& name, TestFn fn);
  void set_global(const std::string& name, Value value);

  // Parses a template; throws TemplateError (kSyntax) naming `name` and the line.
  Template from_string(std::string_view source, std::string name = "template") const;

 private:
  Runtime& mutable_runtime();

  Options options_;
  std::shared_ptr<Runtime> runtime_;
};

// A parsed template. Cheap to copy; render() may run concurrently from several threads.
class Template {
 public:
  // `context` is a JSON object of top-level variables (key order is kept, as Python's dicts do).
  std::string render(const nlohmann::ordered_json& context) const;
  std::string render(const std::vector<std::pair<std::string, Value>>& context) const;
  const std::string& name() const { return name_; }

 private:
  friend class Environment;
  std::shared_ptr<const Runtime> runtime_;
  std::shared_ptr<const Body> body_;
  std::string name_;
};

// JSON → template value: objects become insertion-ordered dicts, integers stay ints.
Value value_from_json(const nlohmann::ordered_json& j);

}  // namespace atom::jinja
