// Typed access to tokenizer.json fields with errors that name the file and the field.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"

namespace atom::tokenizer {

using Json = nlohmann::json;

// `where` reads like "tokenizer.json: pre_tokenizer.pretokenizers[1]".
inline const Json& json_field(const Json& j, std::string_view key, std::string_view where) {
  auto it = j.find(key);
  if (it == j.end()) fail("{}: missing field \"{}\"", where, key);
  return *it;
}

inline std::string json_string(const Json& j, std::string_view key, std::string_view where) {
  const Json& v = json_field(j, key, where);
  if (!v.is_string()) fail("{}.{}: expected a string, got {}", where, key, v.type_name());
  return v.get<std::string>();
}

inline std::optional<std::string> json_opt_string(const Json& j, std::string_view key,
                                                  std::string_view where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) fail("{}.{}: expected a string, got {}", where, key, it->type_name());
  return it->get<std::string>();
}

inline bool json_bool(const Json& j, std::string_view key, bool fallback, std::string_view where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail("{}.{}: expected true or false, got {}", where, key, it->type_name());
  return it->get<bool>();
}

inline int64_t json_int(const Json& j, std::string_view key, std::string_view where) {
  const Json& v = json_field(j, key, where);
  if (!v.is_number_integer()) fail("{}.{}: expected an integer, got {}", where, key, v.type_name());
  return v.get<int64_t>();
}

inline std::string json_type(const Json& j, std::string_view where) {
  if (!j.is_object()) fail("{}: expected an object, got {}", where, j.type_name());
  return json_string(j, "type", where);
}

// A single character field (Metaspace replacement, Strip content).
std::u32string json_chars(const Json& j, std::string_view key, std::string_view where);

}  // namespace atom::tokenizer
