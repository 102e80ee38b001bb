// Checkpoint names -> parameter names: scale renames, the model's weights_mapping, and the rule
// that layers past num_hidden_layers (MTP layers) load only for a drafter.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace atom {

// Renames applied in order: prefixes, then substrings, then suffixes. A rename to nullopt drops
// the tensor (it is then not wanted).
struct WeightsMapper {
  std::vector<std::pair<std::string, std::optional<std::string>>> prefix, substr, suffix;
  std::optional<std::string> apply(std::string name) const;
  bool empty() const { return prefix.empty() && substr.empty() && suffix.empty(); }
};

// How a fused parameter is fed: checkpoint module `ckpt` (a dotted name component, e.g.
// "q_proj") goes to module `param` ("qkv_proj") as part `shard` ("q").
struct PackedModule {
  std::string ckpt;
  std::string param;
  std::string shard;
};

// Index N of the first ".layers.N." (or leading "layers.N.") component; -1 when none.
int64_t weight_name_layer_index(const std::string& name);

// Replaces the dotted component `from` with `to` in `name`; nullopt when `from` is not a
// component of `name`.
std::optional<std::string> weight_name_replace_component(const std::string& name,
                                                         const std::string& from,
                                                         const std::string& to);

class CheckpointNameRewriter {
 public:
  // spec_decode: a drafter load (the spec's rewrite_spec_layer_name). spec_layer_rewrite then
  // maps every checkpoint name, with its layer index (-1: none), to the drafter's parameter name
  // or nullopt (not wanted): MTP layers are those at index >= num_hidden_layers.
  using SpecRewrite =
      std::function<std::optional<std::string>(const std::string& name, int64_t layer)>;

  CheckpointNameRewriter(int64_t num_hidden_layers, WeightsMapper mapper, bool spec_decode = false,
                         SpecRewrite spec_layer_rewrite = nullptr)
      : num_layers_(num_hidden_layers),
        mapper_(std::move(mapper)),
        spec_decode_(spec_decode),
        spec_rewrite_(std::move(spec_layer_rewrite)) {}

  // The parameter-side name of checkpoint tensor `name`, or nullopt when this load does not want
  // it.
  std::optional<std::string> rewrite(const std::string& name) const;

 private:
  int64_t num_layers_;
  WeightsMapper mapper_;
  bool spec_decode_;
  SpecRewrite spec_rewrite_;
};

}  // namespace atom
