// Python attributes of built-in values as the immutable sandbox exposes them: str methods
// ("a,b".split(",")), dict methods (d.items(), d.get(k)), list and tuple methods. Mutating methods
// (list.append, dict.update, ...) come back as an undefined value that raises when called, which is
// what jinja2's ImmutableSandboxedEnvironment does.
#pragma once

#include <optional>
#include <string>

#include "jinja/value.h"

namespace atom::jinja {

// getattr(obj, name) for str, dict, list and tuple values; nullopt when Python has no such
// attribute (jinja2 then tries obj[name]).
std::optional<Value> python_attribute(const Value& obj, const std::string& name);

// Python str methods used by filters too.
std::vector<Value> str_split(const std::string& s, const Value& sep, int64_t maxsplit,
                             bool from_right);
std::vector<std::string> str_splitlines(const std::string& s, bool keepends);
std::string str_replace(const std::string& s, const std::string& old, const std::string& repl,
                        int64_t count);
std::string str_title(const std::string& s);
std::string str_capitalize(const std::string& s);
std::string str_center(const std::string& s, int64_t width, char32_t fill);

}  // namespace atom::jinja
