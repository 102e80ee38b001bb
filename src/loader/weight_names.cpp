#include "loader/weight_names.h"

#include <cstdlib>

namespace atom {

std::optional<std::string> WeightsMapper::apply(std::string name) const {
  for (const auto& [from, to] : prefix) {
    if (name.starts_with(from)) {
      if (!to) return std::nullopt;
      name = *to + name.substr(from.size());
    }
  }
  for (const auto& [from, to] : substr) {
    const size_t pos = name.find(from);
    if (pos != std::string::npos) {
      if (!to) return std::nullopt;
      name = name.substr(0, pos) + *to + name.substr(pos + from.size());
    }
  }
  for (const auto& [from, to] : suffix) {
    if (name.ends_with(from)) {
      if (!to) return std::nullopt;
      name = name.substr(0, name.size() - from.size()) + *to;
    }
  }
  return name;
}

int64_t weight_name_layer_index(const std::string& name) {
  size_t pos = 0;
  for (;;) {
    const size_t at = name.find("layers.", pos);
    if (at == std::string::npos) return -1;
    if (at == 0 || name[at - 1] == '.') {
      const char* s = name.c_str() + at + 7;
      char* end = nullptr;
      const long v = std::strtol(s, &end, 10);
      if (end != s && (*end == '.' || *end == '\0')) return v;
    }
    pos = at + 1;
  }
}

std::optional<std::string> weight_name_replace_component(const std::string& name,
                                                         const std::string& from,
                                                         const std::string& to) {
  size_t pos = 0;
  while ((pos = name.find(from, pos)) != std::string::npos) {
    const bool left = pos == 0 || name[pos - 1] == '.';
    const size_t end = pos + from.size();
    const bool right = end == name.size() || name[end] == '.';
    if (left && right) return name.substr(0, pos) + to + name.substr(end);
    ++pos;
  }
  return std::nullopt;
}

std::optional<std::string> CheckpointNameRewriter::rewrite(const std::string& name) const {
  std::string n = name;
  // FP8 block scales: DeepSeek-style checkpoints store the inverse scale under this name.
  if (n.ends_with("weight_scale_inv")) n = n.substr(0, n.size() - 4);
  if (!mapper_.empty()) {
    auto m = mapper_.apply(n);
    if (!m) return std::nullopt;
    n = *m;
  }
  const int64_t layer = weight_name_layer_index(n);
  // A drafter load reads the target's checkpoint: the drafter's rewrite decides every name (its
  // MTP layers at index >= num_layers, and the top-level tensors it may want), never the target's.
  if (spec_decode_) return spec_rewrite_ ? spec_rewrite_(n, layer) : std::nullopt;
  if (layer >= num_layers_) return std::nullopt;
  return n;
}

}  // namespace atom
