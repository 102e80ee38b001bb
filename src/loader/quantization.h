// quantization_config from config.json: the method a checkpoint's weights are stored in, and the
// modules it leaves unquantised. A model states which methods it reads (Model::
// quantization_methods); any other is an error naming it before a weight is read.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace atom {

class ConfigFields;

struct QuantizationConfig {
  std::string method;  // quant_method: "mxfp4", "fp8", "compressed-tensors", ...
  // modules_to_not_convert / ignore / ignored_layers: exact module names, prefixes of them,
  // transformers' "*" globs, or "re:" regular expressions.
  std::vector<std::string> not_converted;
  nlohmann::json raw;  // the whole object, for the method's own fields

  // True when `module` (a dotted parameter-side name, e.g. "model.layers.0.self_attn.q_proj") is
  // left unquantised.
  bool excludes(const std::string& module) const;
};

// Reads root.quantization_config; nullopt when absent or null.
std::optional<QuantizationConfig> quantization_config_parse(const ConfigFields& root);

}  // namespace atom
