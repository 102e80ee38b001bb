#include "loader/quantization.h"

#include <regex>

#include "core/error.h"
#include "loader/hf_config.h"

namespace atom {

namespace {
// transformers' fnmatch-style patterns: "*" matches any run of characters.
bool glob_match(const std::string& pattern, const std::string& s) {
  size_t p = 0, i = 0, star = std::string::npos, mark = 0;
  while (i < s.size()) {
    if (p < pattern.size() && pattern[p] == s[i]) {
      ++p;
      ++i;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = i;
    } else if (star != std::string::npos) {
      p = star + 1;
      i = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}
}  // namespace

bool QuantizationConfig::excludes(const std::string& module) const {
  for (const auto& m : not_converted) {
    if (m.starts_with("re:")) {
      if (std::regex_search(module, std::regex(m.substr(3)))) return true;
    } else if (m.find('*') != std::string::npos) {
      if (glob_match(m, module) || glob_match(m + ".*", module)) return true;
    } else if (module == m || module.starts_with(m + ".")) {
      return true;
    }
  }
  return false;
}

std::optional<QuantizationConfig> quantization_config_parse(const ConfigFields& root) {
  if (!root.has("quantization_config")) return std::nullopt;
  const nlohmann::json& j = root.obj()["quantization_config"];
  if (!j.is_object()) root.bad("quantization_config", "must be an object");
  const ConfigFields q(j, root.where() + " (quantization_config)");
  QuantizationConfig c;
  c.raw = j;
  c.method = q.get_string("quant_method");
  for (const char* key : {"modules_to_not_convert", "ignore", "ignored_layers"}) {
    if (!q.has(key)) continue;
    for (const auto& m : q.get_string_list(key)) {
      if (m.starts_with("re:")) {
        try {
          std::regex r(m.substr(3));
        } catch (const std::regex_error& e) {
          q.bad(key, "holds an invalid regular expression '" + m + "'");
        }
      }
      c.not_converted.push_back(m);
    }
  }
  return c;
}

}  // namespace atom
