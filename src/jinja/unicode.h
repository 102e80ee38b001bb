// UTF-8 helpers for Python string semantics: templates index, slice, measure and case-map strings
// by code point, as Python's str does, while atom keeps strings as UTF-8 bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace atom::jinja::unicode {

// Decodes one code point at s[i] and advances i. Invalid bytes decode as themselves (Latin-1
// style) so that arbitrary bytes never throw; templates and JSON input are valid UTF-8.
char32_t decode(std::string_view s, size_t& i);
void append(std::string& out, char32_t cp);
std::u32string to_u32(std::string_view s);
std::string from_u32(std::u32string_view s);

bool is_ascii(std::string_view s);
// Number of code points (Python len()).
size_t length(std::string_view s);
// Byte offset of code point index `cp_index` (clamped to the end).
size_t byte_offset(std::string_view s, size_t cp_index);
// Code point index of byte offset `byte` (which must be on a code point boundary).
size_t cp_index(std::string_view s, size_t byte);

// Python's str.isspace() for one code point (also what str.split()/strip() use).
bool is_space(char32_t c);
// Python's str.splitlines() line boundaries.
bool is_line_break(char32_t c);
bool is_alpha(char32_t c);
bool is_decimal(char32_t c);
bool is_digit(char32_t c);
bool is_numeric(char32_t c);
bool is_alnum(char32_t c);
bool is_upper(char32_t c);
bool is_lower(char32_t c);
bool is_title(char32_t c);
bool is_cased(char32_t c);
bool is_printable(char32_t c);
// Python's \w in a str regex: alphanumeric or underscore.
bool is_word(char32_t c);

char32_t to_upper(char32_t c);
char32_t to_lower(char32_t c);
char32_t to_title(char32_t c);

std::string upper(std::string_view s);
std::string lower(std::string_view s);

// Python str.strip family. `chars` null means whitespace.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);

}  // namespace atom::jinja::unicode
