// jinja2's built-in filters and tests (filters.py, tests.py), registered by name.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "jinja/interpreter.h"

namespace atom::jinja {

void register_string_filters(std::unordered_map<std::string, FilterFn>& filters);
void register_sequence_filters(std::unordered_map<std::string, FilterFn>& filters);
void register_builtin_tests(std::unordered_map<std::string, TestFn>& tests);

// jinja2 filters that atom does not implement: templates naming them fail with a clear message
// instead of "no such filter".
const std::vector<std::string>& unsupported_filters();

// Helpers shared by the filter files.
// make_attrgetter: "a.b.0" looked up item by item with the environment's getitem.
Value attr_lookup(Interpreter& ip, const Value& item, const Value& attribute);
// jinja2's soft_str: str() of the value (Undefined gives "").
inline std::string soft_str(const Value& v) { return v.is_string() ? v.str() : to_str(v); }
// Python bool() of an optional argument, with a default.
bool arg_bool(const std::optional<Value>& v, bool dflt);
int64_t arg_integer(const std::optional<Value>& v, int64_t dflt, const char* what);

}  // namespace atom::jinja
