// Helpers for comparing atom's rendering with the jinja2 reference files that reference.py writes.
#pragma once

#include <ctime>
#include <nlohmann/json.hpp>
#include <string>

namespace atom::test {

// Loads ATOM_CHAT_TEMPLATE_REF_DIR/<name>; fails the test (with how to produce it) when missing.
nlohmann::ordered_json load_reference(const std::string& name);

// A readable account of the first difference between two renderings: the offset, line and
// column, and both texts around it with invisible characters escaped. Empty when equal.
std::string first_difference(const std::string& expected, const std::string& actual);

// hf_jinja.FIXED_NOW, the time both renderers give strftime_now(): 2025-07-04 15:30:05.
std::tm fixed_now();

// Escapes control characters and backslashes so whitespace differences are visible.
std::string visible(const std::string& s);

}  // namespace atom::test
