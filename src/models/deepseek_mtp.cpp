#include "models/deepseek_mtp.h"

namespace atom {

std::optional<std::string> deepseek_mtp_rewrite(const std::string& name, int64_t layer,
                                                int64_t num_hidden_layers) {
  if (layer < num_hidden_layers) return std::nullopt;  // the target's (or top-level) tensors
  const std::string head = "model.layers." + std::to_string(layer) + ".";
  if (!name.starts_with(head)) return name;  // unclaimed: the loader names it
  const std::string rest = name.substr(head.size());
  if (rest.starts_with("embed_tokens.")) return "model." + rest;
  for (const char* own : {"enorm.", "hnorm.", "eh_proj.", "shared_head."})
    if (rest.starts_with(own)) return name;
  return head + "mtp_block." + rest;
}

}  // namespace atom
