// The loading loop: checkpoint tensors -> names -> parameters through their weight loaders,
// concurrently, then coverage (every parameter filled, every tensor claimed) and post-load steps.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "loader/checkpoint.h"
#include "loader/parameter.h"
#include "loader/weight_names.h"

namespace atom {

// One entry of a model's expert mapping (the spec's make_expert_params_mapping tuples): checkpoint
// name part `ckpt` ("experts.3.gate_proj.", matched on whole dotted components) is replaced by
// `param` ("experts.w13_") and the tensor goes to that parameter as part `shard` of expert
// `expert`. A stacked tensor of every routed expert ("experts.gate_up_proj", the last component of
// the name) has expert -1.
struct ExpertParamMapping {
  std::string param;
  std::string ckpt;
  int expert = -1;
  std::string shard;
};

// What a model declares about its checkpoint.
struct WeightLoadSpec {
  int64_t num_hidden_layers = 0;
  std::vector<PackedModule> packed_modules;
  std::vector<ExpertParamMapping> expert_mapping;
  WeightsMapper weights_mapping;
  // Parameter-side names that may be present in a checkpoint but are not needed
  // (e.g. rotary_emb.inv_freq, or lm_head.weight when embeddings are tied).
  std::function<bool(const std::string& name)> ignorable;
  // Called with every checkpoint tensor's name before any data is read, to reject a checkpoint
  // whose tensors do not fit together (e.g. a quantised weight without its scales).
  std::function<void(const std::vector<std::string>& names)> check_names;
  bool spec_decode = false;
  CheckpointNameRewriter::SpecRewrite spec_layer_rewrite;
};

struct LoadReport {
  CheckpointStats checkpoint;
  int expert_bulk_copies = 0;    // expert parameters staged and written in one copy
  int expert_region_copies = 0;  // staged (slot, shard) regions written one by one
  int tensors_loaded = 0;
  int tensors_ignored = 0;     // declared ignorable
  int tensors_not_wanted = 0;  // skipped by name rules (e.g. MTP layers)
  // Expert parallelism: tensors of experts another rank holds, left unread, and their bytes.
  int tensors_other_ranks = 0;
  uint64_t bytes_other_ranks = 0;
  // Pipeline parallelism: tensors of the modules other stages hold, left unread, and their bytes.
  int tensors_other_stages = 0;
  uint64_t bytes_other_stages = 0;
  double seconds = 0;
};

// Where one checkpoint tensor goes.
struct WeightDestination {
  // kOtherRank: an expert of an expert-parallel layer that another rank holds. kOtherStage: a
  // tensor of a module another pipeline stage holds (ParamRegistry::add_missing_module).
  enum Kind { kParam, kNotWanted, kIgnored, kUnclaimed, kOtherRank, kOtherStage } kind = kUnclaimed;
  Parameter* param = nullptr;
  std::string shard;
  int expert = -1;
};

// The expert mapping indexed for lookups by name (built once per load).
class ExpertMappingIndex {
 public:
  explicit ExpertMappingIndex(const std::vector<ExpertParamMapping>& mapping);
  // The entry matching `name` and the parameter name it gives, or nullptr.
  const ExpertParamMapping* match(const std::string& name, std::string* param_name) const;

 private:
  std::map<std::string, const ExpertParamMapping*> by_ckpt_;
  std::set<std::string> heads_;  // first components of the ckpt parts ("experts")
};

WeightDestination weight_destination(ParamRegistry& params, const CheckpointNameRewriter& rewriter,
                                     const WeightLoadSpec& spec, const std::string& ckpt_name,
                                     const ExpertMappingIndex* experts = nullptr);

LoadReport load_weights(ParamRegistry& params, const Checkpoint& checkpoint,
                        const WeightLoadSpec& spec, const CheckpointReadOptions& options);

}  // namespace atom
