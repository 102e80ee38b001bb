#include "core/env.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace atom {

bool env_bool(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  fail("environment variable {}='{}' is not a boolean (true/false/1/0)", name, v);
}

long env_int(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long r = std::strtol(v, &end, 10);
  if (*end != '\0') fail("environment variable {}='{}' is not an integer", name, v);
  return r;
}

std::string env_str(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

}  // namespace atom
