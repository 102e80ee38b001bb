// Internal toggles read from ATOM_* environment variables (each is listed in docs/architecture.md).
#pragma once

#include <string>

namespace atom {

// "1", "true", "yes", "on" (any case) are true; "0", "false", "no", "off" false; anything else
// is an error naming the variable.
bool env_bool(const char* name, bool fallback);
long env_int(const char* name, long fallback);
std::string env_str(const char* name, const std::string& fallback);

}  // namespace atom
