// Python literals, read as ast.literal_eval reads them, into JSON values: what the pythonic
// tool-call format writes as arguments, and the fallback vLLM's qwen3_coder and glm45 parsers use
// for argument text that is not JSON.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace atom::server {

// A literal: str (' " ''' """ quotes, r/u prefixes, Python's escapes, adjacent strings joined),
// int (decimal, 0x/0o/0b, underscores; 64-bit, beyond is refused), float, True/False/None,
// lists and tuples (as arrays), dicts whose keys are str/int/True/False/None (written as
// json.dumps writes such keys), and a sign on a number. Anything else (sets, bytes, complex,
// f-strings, names, calls, expressions) is refused: nullopt. Whitespace around it is allowed.
std::optional<nlohmann::ordered_json> py_literal_eval(std::string_view text);

// A call `name(key=literal, ...)` with keyword arguments only (the pythonic tool format); the
// arguments in order. nullopt for anything else.
struct PyCall {
  std::string name;
  nlohmann::ordered_json arguments;  // an object
};
std::optional<PyCall> py_parse_call(std::string_view text);

// Scans Python source from text[0] to the end of the bracket opened there (`(`, `[` or `{`),
// skipping string literals. Returns one past the closing bracket; npos while the text ends
// before it; kPyScanError when brackets do not match.
inline constexpr size_t kPyScanError = std::string::npos - 1;
size_t py_scan_bracket(std::string_view text);
// The same, resumable: called again with the same text grown at its end, it goes on where it
// stopped (a stream is scanned once, not once per piece).
struct PyScanState {
  size_t pos = 0;
  std::vector<char> stack;  // the closing brackets expected
  char quote = 0;           // inside a string literal opened by this quote
  bool triple = false, escaped = false;
};
size_t py_scan_bracket(std::string_view text, PyScanState& state);

}  // namespace atom::server
