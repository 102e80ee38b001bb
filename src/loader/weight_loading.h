// The loading loop: checkpoint tensors -> names -> parameters through their weight loaders,
// concurrently, then coverage (every parameter filled, every tensor claimed) and post-load steps.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "loader/checkpoint.h"
#include "loader/parameter.h"
#include "loader/weight_names.h"

namespace atom {

// What a model declares about its checkpoint.
struct WeightLoadSpec {
  int64_t num_hidden_layers = 0;
  std::vector<PackedModule> packed_modules;
  WeightsMapper weights_mapping;
  // Parameter-side names that may be present in a checkpoint but are not needed
  // (e.g. rotary_emb.inv_freq, or lm_head.weight when embeddings are tied).
  std::function<bool(const std::string& name)> ignorable;
  bool spec_decode = false;
  CheckpointNameRewriter::SpecRewrite spec_layer_rewrite;
};

struct LoadReport {
  CheckpointStats checkpoint;
  int tensors_loaded = 0;
  int tensors_ignored = 0;  // declared ignorable
  int tensors_not_wanted = 0;  // skipped by name rules (e.g. MTP layers)
  double seconds = 0;
};

// Where one checkpoint tensor goes.
struct WeightDestination {
  enum Kind { kParam, kNotWanted, kIgnored, kUnclaimed } kind = kUnclaimed;
  Parameter* param = nullptr;
  std::string shard;
  int expert = -1;
};

WeightDestination weight_destination(ParamRegistry& params, const CheckpointNameRewriter& rewriter,
                                     const WeightLoadSpec& spec, const std::string& ckpt_name);

LoadReport load_weights(ParamRegistry& params, const Checkpoint& checkpoint,
                        const WeightLoadSpec& spec, const CheckpointReadOptions& options);

}  // namespace atom
