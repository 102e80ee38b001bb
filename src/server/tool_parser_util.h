// Pieces the tool-call and reasoning parsers share: finding tags in text that arrives in pieces,
// and writing values as Python's json.dumps does (vLLM serialises arguments with it).
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace atom::server::parse_util {

inline constexpr const char* kSpace = " \t\r\n";

// Length of the longest suffix of `s` that is a proper prefix of `tag`: text that must be held
// back because the next piece may complete the tag.
size_t partial_tag_suffix(std::string_view s, std::string_view tag);
// The same for several tags: the longest such suffix over all of them.
size_t partial_tag_suffix(std::string_view s, std::initializer_list<std::string_view> tags);

// True when `s` is a proper prefix of `tag` (the tag may still arrive).
bool is_partial(std::string_view s, std::string_view tag);
bool starts_with(std::string_view s, std::string_view prefix);

// The earliest occurrence at or after `from` of any of `tags`; `which` is its index in the list.
struct Found {
  size_t pos = std::string::npos;
  int which = -1;
  bool found() const { return which >= 0; }
};
Found find_first(std::string_view s, std::initializer_list<std::string_view> tags, size_t from = 0);

bool all_space(std::string_view s);
std::string trim(std::string_view s);

// Python's json.dumps(value, ensure_ascii=...): ", " and ": " separators, keys in order, floats
// as Python's repr. Never throws.
std::string py_json_dumps(const nlohmann::ordered_json& value, bool ensure_ascii);
// The inside of json.dumps(s, ensure_ascii=False) for a string (no quotes). Escaping is per
// character, so pieces of a string may be escaped separately and joined.
std::string json_escape(std::string_view s);
// json.loads: an ordered value, or a discarded one when `text` is not JSON (or nests deeper
// than 512 levels). Use it, not nlohmann's parse, on model output.
nlohmann::ordered_json json_loads(std::string_view text);

}  // namespace atom::server::parse_util
