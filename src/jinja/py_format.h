// Python's text formatting of values: printf-style `%`, str.format, and json.dumps (which
// transformers' tojson filter calls), byte-for-byte as CPython writes them.
#pragma once

#include <optional>
#include <string>

#include "jinja/value.h"

namespace atom::jinja {

// `fmt % args` (args: a tuple, a dict for %(name)s, or a single value).
std::string percent_format(const std::string& fmt, const Value& args);

// str.format(*args, **kwargs): fields {}, {0}, {name}, {x.attr}, {x[0]}, conversions !s !r and
// format specs ([[fill]align][sign][#][0][width][,|_][.precision][type]).
std::string str_format(Interpreter& ip, const std::string& fmt, const CallArgs& args);
// format(value, spec) as str.format applies it.
std::string format_spec(const Value& v, const std::string& spec);

struct JsonOptions {
  bool ensure_ascii = true;
  std::optional<std::string> indent;  // nullopt: one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

// json.dumps(v, ...). Raises for values JSON cannot hold (Undefined, namespaces, generators).
std::string json_dumps(const Value& v, const JsonOptions& options);

}  // namespace atom::jinja
