// Pieces the tool-call and reasoning parsers share: finding tags in text that arrives in pieces,
// scanning JSON for its end, and writing values as Python's json.dumps does (vLLM serialises
// arguments with it).
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace atom::server::parse_util {

inline constexpr const char* kSpace = " \t\r\n";
inline bool is_space(char c) { return std::string_view(kSpace).find(c) != std::string_view::npos; }

// A call's name is short and on one line: text that goes on longer is no name.
inline constexpr size_t kMaxName = 256;

// Length of the longest suffix of `s` that is a proper prefix of `tag`: text that must be held
// back because the next piece may complete the tag.
size_t partial_tag_suffix(std::string_view s, std::string_view tag);
// The same for several tags: the longest such suffix over all of them.
size_t partial_tag_suffix(std::string_view s, std::initializer_list<std::string_view> tags);

// True when `s` is a proper prefix of `tag` (the tag may still arrive).
bool is_partial(std::string_view s, std::string_view tag);
bool starts_with(std::string_view s, std::string_view prefix);

// The earliest occurrence at or after `from` of any of `tags`; `which` is its index in the list
// and `size` its length.
struct Found {
  size_t pos = std::string::npos;
  size_t size = 0;
  int which = -1;
  bool found() const { return which >= 0; }
  size_t end() const { return pos + size; }
};
Found find_first(std::string_view s, std::initializer_list<std::string_view> tags, size_t from = 0);

// What can be attributed of `held` now, taken out of it: the text before the earliest of `tags`
// when one is there (the tag stays at the front of `held`: tag.pos is 0), else all of it but a
// suffix that may be the start of a tag (the next piece may complete it).
struct Taken {
  std::string text;
  Found tag;
};
Taken take_before(std::string& held, std::initializer_list<std::string_view> tags);

// `tag`'s position in `s`, searching from `from`: a miss moves `from` to where the tag could
// still start and a hit resets it, so a long body that arrives in pieces is scanned once.
size_t find_resuming(std::string_view s, std::string_view tag, size_t& from);

// Moves the leading whitespace of `from` to the end of `to`; false when nothing else is in `from`.
bool move_leading_space(std::string& from, std::string& to);

bool all_space(std::string_view s);
std::string trim(std::string_view s);

// JSON text read a character at a time: bracket depth, with strings (and the escapes in them)
// skipped, so brackets in strings do not count.
struct JsonNesting {
  int depth = 0;
  bool in_string = false, escaped = false;
  // Reads `c`: +1 when it opens a bracket, -1 when it closes one, else 0.
  int step(char c);
};
// Scans JSON from text[0] (an object or array) to the end of that value: one past its closing
// bracket, or npos while the text ends before it. Called again with the same text grown at its
// end, it goes on where it stopped (pos: where; lower it when the front of the text is dropped).
struct JsonScan {
  size_t pos = 0;
  JsonNesting nesting;
};
size_t json_scan_value(std::string_view text, JsonScan& scan);

// Python's json.dumps(value, ensure_ascii=...): ", " and ": " separators, keys in order, floats
// as Python's repr. Never throws.
std::string py_json_dumps(const nlohmann::ordered_json& value, bool ensure_ascii);
// The inside of json.dumps(s, ensure_ascii=False) for a string (no quotes). Escaping is per
// byte, so pieces of a string (even of one character) may be escaped separately and joined.
std::string json_escape(std::string_view s);
// json.loads: an ordered value, or a discarded one when `text` is not JSON (or nests deeper
// than 512 levels). Use it, not nlohmann's parse, on model output.
nlohmann::ordered_json json_loads(std::string_view text);

}  // namespace atom::server::parse_util
