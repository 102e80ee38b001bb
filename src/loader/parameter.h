// Parameter: a model tensor that checkpoint data is written into, with its own weight loader
// (which knows how to slice a checkpoint tensor for this tensor-parallel rank) and coverage
// tracking (which parts - shards, experts - have arrived).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace atom {

class Parameter;

// Writes checkpoint tensor `ckpt` (a CPU view, any dtype) into `param` for part `shard`
// ("" for a plain tensor, "q"/"k"/"v", "0"/"1", ...) of expert `expert` (-1: not an expert).
using WeightLoader =
    std::function<void(Parameter& param, const Tensor& ckpt, const std::string& shard, int expert)>;

// How a fused expert parameter [num_slots, ...] is laid out, for the loaders that write one
// (slot, shard) region at a time: the per-expert weight loader and the batched staging pool
// (loader/expert_staging.h). Slots [0, num_base) are the routed base experts; fused shared
// experts and redundant copies come after them.
struct ExpertLayout {
  int64_t num_base = 0;
  // The checkpoint's expert id of slot 0 (expert parallelism: this rank holds routed experts
  // [first_base, first_base + num_base) in slots [0, num_base)).
  int64_t first_base = 0;
  int64_t num_slots = 0;
  std::vector<int64_t> redundant_slots;  // copies filled after loading; zeroed until then
  std::vector<std::string> shards;       // the parts each slot takes, e.g. {"w1", "w3"}
  bool has_shard(const std::string& s) const {
    for (const auto& x : shards)
      if (x == s) return true;
    return false;
  }
  // False when checkpoint tensors must go through the parameter's loader (FP8 experts, which
  // pair each weight with its scale): the staging pool then leaves the parameter alone.
  bool stageable = true;
  // The region of one slot's view (of the parameter or of a staging buffer) that `shard` fills.
  std::function<Tensor(const Tensor& slot, const std::string& shard)> region;
  // Writes this rank's part of checkpoint tensor `ckpt` into `region` (the padding past the
  // checkpoint's width is left as it is, zero).
  std::function<void(Tensor& region, const Tensor& ckpt, const std::string& shard)> write;
};

class Parameter {
 public:
  Parameter(std::string name, Tensor data, WeightLoader loader,
            std::vector<std::string> expected_parts);

  const std::string& name() const { return name_; }
  Tensor& data() { return data_; }
  const Tensor& data() const { return data_; }

  // Runs the weight loader and records the part; a part written twice is an error.
  void load(const Tensor& ckpt, const std::string& shard, int expert);
  // Records a part written by some other path (a staged expert region, the parts a stacked
  // tensor covers); a part recorded twice is an error.
  void record_part(const std::string& key);
  std::vector<std::string> missing_parts() const;
  bool received_nothing() const;

  // An optional parameter may stay unloaded (it is then left as initialised).
  bool optional = false;
  // Set for fused expert parameters (FusedMoE): lets the staging pool write their regions.
  std::shared_ptr<const ExpertLayout> expert_layout;
  // Expert parallelism: whether this rank holds checkpoint expert `expert` (>= 0) of this
  // parameter; the loader leaves the other experts' tensors unread. Unset: every expert.
  std::function<bool(int expert)> holds_expert;
  // --load-format dummy: how to fill this parameter when its values are not floats to draw
  // uniformly (packed MXFP4 codes and their scales); unset: model_fill_dummy's default.
  std::function<void(Tensor& data, uint64_t seed)> dummy_fill;

  static std::string part_key(const std::string& shard, int expert);

 private:
  std::string name_;
  Tensor data_;
  WeightLoader loader_;
  std::vector<std::string> expected_;
  std::set<std::string> received_;
  mutable std::mutex mu_;
};

// Checks `ckpt` has `shape`; otherwise an Error naming the parameter and both shapes.
void param_check_shape(const Parameter& p, const Tensor& ckpt, const Shape& shape,
                       const std::string& what);

// The loader for a tensor copied whole (replicated across ranks): shapes must match.
WeightLoader default_weight_loader();

// The model's parameters by name, plus the steps to run after all weights are loaded.
class ParamRegistry {
 public:
  Parameter& add(const std::string& name, Tensor data,
                 WeightLoader loader = default_weight_loader(),
                 std::vector<std::string> expected_parts = {""});
  Parameter* find(const std::string& name);
  const std::map<std::string, std::unique_ptr<Parameter>>& all() const { return params_; }

  // A module this rank does not hold (the spec's PPMissingLayer: another pipeline stage's layers,
  // embedding or head): checkpoint tensors under `prefix.` are left unread.
  void add_missing_module(const std::string& prefix) { missing_.push_back(prefix + "."); }
  // Whether parameter-side name `name` lies under a missing module.
  bool in_missing_module(const std::string& name) const;

  // process_weights_after_loading: runs in registration order once loading is complete.
  void add_post_load(std::function<void()> fn) { post_load_.push_back(std::move(fn)); }
  void run_post_load();

 private:
  std::map<std::string, std::unique_ptr<Parameter>> params_;
  std::vector<std::function<void()>> post_load_;
  std::vector<std::string> missing_;
};

}  // namespace atom
