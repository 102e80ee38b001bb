// Python operators on template values: arithmetic with int/float rules, sequence concatenation
// and repetition, `in` and slicing.
#pragma once

#include <optional>
#include <string>

#include "jinja/ast.h"
#include "jinja/py_format.h"
#include "jinja/value.h"

namespace atom::jinja {

// a <op> b. `max_bytes` caps strings and lists built by + and *.
Value binary_op(BinOp op, const Value& a, const Value& b, size_t max_bytes);
// -x and +x.
Value unary_op(char op, const Value& x);
// item in container.
bool contains(const Value& container, const Value& item);
// obj[start:stop:step] for str, list and tuple. jinja2 compiles slices to plain Python
// subscripts (not the environment's getitem), so anything else raises.
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// jinja2's object_type_repr: "dict object", "None", ... for undefined-value messages.
std::string object_type_repr(const Value& v);
// Python int from a number, raising for non-numbers.
int64_t to_index(const Value& v, const char* what);

}  // namespace atom::jinja
