// Batched expert staging (the spec's ExpertStagingPool). On large MoE checkpoints every expert
// arrives as its own small tensor; written one by one, a GPU parameter takes one small
// host-to-device copy per (expert, shard). With the parallel loader (ATOM_LOADER_NUM_THREADS > 1)
// the pool collects them in a host buffer shaped like the fused parameter and writes it back in
// one copy.
//
// Rules:
// - The pool owns routed base experts only (slots [0, ExpertLayout::num_base), checkpoint experts
//   from ExpertLayout::first_base under expert parallelism). Fused shared
//   experts and every other path write the parameter directly; a path that writes regions the
//   pool may own (a stacked tensor of all routed experts) first calls decline(), which writes back
//   whatever was staged and hands the parameter over.
// - When every routed base (slot, shard) region has arrived, slots [0, num_base) go to the
//   parameter in one copy and the redundant slots are zeroed (they are filled after loading);
//   otherwise, at finish(), each staged region is copied on its own.
// - Writes are at region granularity: the staging buffer starts zeroed, so a region's padding
//   past the checkpoint's width stays zero on both sides.
// - A parameter that never receives every routed base region fails the load, naming it and how
//   many (slot, shard) regions arrived; strict = false (ATOM_LOADER_STRICT_COVERAGE=false) makes
//   that a warning, leaving those slots as initialised.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "loader/parameter.h"

namespace atom {

class ExpertStagingPool {
 public:
  explicit ExpertStagingPool(bool strict = true) : strict_(strict) {}

  // True when part `shard` of `expert` of `p` is a routed base expert's region the pool stages (p
  // has an expert layout with that part and has not been declined); the caller then leaves the
  // tensor to stage().
  bool owns(const Parameter& p, int expert, const std::string& shard);
  // Records the part on `p` (a duplicate is an error) and stages this rank's slice of `ckpt` into
  // the host buffer; the last routed base region flushes the parameter in one copy.
  void stage(Parameter& p, const Tensor& ckpt, const std::string& shard, int expert);
  // Writes back what was staged for `p` (per region) and leaves `p` to its other loaders.
  void decline(Parameter& p);
  // After the last tensor: per-region copies of parameters still incomplete, then the coverage
  // rule above.
  void finish();

  struct Stats {
    int bulk_copies = 0;    // parameters written in one copy
    int region_copies = 0;  // (slot, shard) regions copied one by one
    int declined = 0;
  };
  Stats stats() const;

 private:
  struct Entry {
    std::mutex mu;  // staging and flushing one parameter; others proceed
    Tensor buffer;  // host, shaped like the parameter, zeroed; undefined once written back
    std::set<std::pair<int64_t, std::string>> arrived;
    bool declined = false;
    bool flushed = false;
  };
  Entry& entry(Parameter& p);
  // Copies each staged region into the parameter and drops the buffer (e.mu held).
  void write_back_regions(Parameter& p, Entry& e);

  bool strict_;
  mutable std::mutex mu_;  // entries_ and stats_
  std::map<Parameter*, std::unique_ptr<Entry>> entries_;
  Stats stats_;
};

// ATOM_LOADER_STRICT_COVERAGE (default true).
bool loader_strict_coverage_from_env();

}  // namespace atom
