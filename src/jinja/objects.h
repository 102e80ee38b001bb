// Runtime objects with behaviour: jinja2's LoopContext, Macro, Namespace, Cycler and Joiner.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "jinja/ast.h"
#include "jinja/interpreter.h"
#include "jinja/value.h"

namespace atom::jinja {

// `loop` inside a for body.
class LoopObject : public Object, public std::enable_shared_from_this<LoopObject> {
 public:
  explicit LoopObject(std::vector<Value> items, int depth0 = 0)
      : items_(std::move(items)), depth0_(depth0) {}
  std::string type_name() const override { return "LoopContext"; }
  std::string repr() const override;
  std::optional<Value> get_attr(const std::string& name) override;

  std::optional<size_t> len() const override { return items_.size(); }
  size_t size() const { return items_.size(); }
  const Value& item(size_t i) const { return items_[i]; }
  void set_index(size_t i) { index0_ = i; }
  // For `for ... recursive` loops: calling `loop(children)` renders the loop over children.
  void set_recurse(std::function<Value(const Value&)> fn) { recurse_ = std::move(fn); }
  bool callable() const override { return static_cast<bool>(recurse_); }
  Value call(Interpreter& ip, CallArgs& args) override;

 private:
  std::vector<Value> items_;
  int depth0_ = 0;
  std::function<Value(const Value&)> recurse_;
  size_t index0_ = 0;
  std::optional<std::vector<Value>> last_changed_;
};

class MacroObject : public Object {
 public:
  MacroObject(std::shared_ptr<const MacroDef> def, ScopePtr closure)
      : def_(std::move(def)), closure_(std::move(closure)) {}
  std::string type_name() const override { return "Macro"; }
  std::string repr() const override { return "<Macro '" + def_->name + "'>"; }
  bool callable() const override { return true; }
  Value call(Interpreter& ip, CallArgs& args) override {
    return ip.call_macro(def_, closure_, args);
  }
  std::optional<Value> get_attr(const std::string& name) override;

 private:
  std::shared_ptr<const MacroDef> def_;
  ScopePtr closure_;
};

// namespace(...): the one mutable object, assigned with {% set ns.attr = value %}.
class NamespaceObject : public Object {
 public:
  std::string type_name() const override { return "Namespace"; }
  std::string repr() const override;
  std::optional<Value> get_attr(const std::string& name) override;
  bool set_attr(const std::string& name, Value v) override;

 private:
  DictData attrs_;
};

// The template globals jinja2 provides: range, dict, namespace, cycler, joiner.
std::vector<std::pair<std::string, Value>> builtin_globals();

}  // namespace atom::jinja
