#include "loader/expert_staging.h"

#include <algorithm>

#include "core/convert.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"

namespace atom {

bool loader_strict_coverage_from_env() { return env_bool("ATOM_LOADER_STRICT_COVERAGE", true); }

ExpertStagingPool::Entry& ExpertStagingPool::entry(Parameter& p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& e = entries_[&p];
  if (!e) e = std::make_unique<Entry>();
  return *e;
}

bool ExpertStagingPool::owns(const Parameter& p, int expert, const std::string& shard) {
  const ExpertLayout* l = p.expert_layout.get();
  if (!l || !l->stageable || expert < l->first_base || expert >= l->first_base + l->num_base)
    return false;
  if (!l->has_shard(shard)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(const_cast<Parameter*>(&p));
  return it == entries_.end() || !it->second->declined;
}

void ExpertStagingPool::stage(Parameter& p, const Tensor& ckpt, const std::string& shard,
                              int expert) {
  const ExpertLayout& layout = *p.expert_layout;
  const int64_t slot = expert - layout.first_base;
  ATOM_CHECK(slot >= 0 && slot < layout.num_base, "staging expert {} of '{}'", expert, p.name());
  bool known = false;
  for (const auto& s : layout.shards) known |= s == shard;
  if (!known) fail("parameter '{}' takes no expert part '{}'", p.name(), shard);
  Entry& e = entry(p);
  std::lock_guard<std::mutex> lock(e.mu);
  p.record_part(Parameter::part_key(shard, expert));  // a duplicate fails here
  ATOM_CHECK(!e.declined && !e.flushed, "staging into '{}' after it was handed over", p.name());
  if (!e.buffer.defined()) e.buffer = Tensor::zeros(p.data().shape(), p.data().dtype());
  Tensor region = layout.region(e.buffer.select(0, slot), shard);
  layout.write(region, ckpt, shard);
  e.arrived.emplace(slot, shard);
  if (static_cast<int64_t>(e.arrived.size()) <
      layout.num_base * static_cast<int64_t>(layout.shards.size()))
    return;
  // Every routed base region is here: slots [0, num_base) in one copy.
  Tensor dst = p.data().narrow(0, 0, layout.num_base);
  dst.copy_from(e.buffer.narrow(0, 0, layout.num_base));
  for (const int64_t slot : layout.redundant_slots) {
    Tensor r = p.data().select(0, slot);
    r.zero_();
  }
  e.buffer = Tensor();
  e.flushed = true;
  std::lock_guard<std::mutex> stats_lock(mu_);
  ++stats_.bulk_copies;
}

void ExpertStagingPool::write_back_regions(Parameter& p, Entry& e) {
  if (!e.buffer.defined()) return;
  const ExpertLayout& layout = *p.expert_layout;
  for (const auto& [slot, shard] : e.arrived) {
    Tensor dst = layout.region(p.data().select(0, slot), shard);
    dst.copy_from(layout.region(e.buffer.select(0, slot), shard));
  }
  e.buffer = Tensor();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.region_copies += static_cast<int>(e.arrived.size());
}

void ExpertStagingPool::decline(Parameter& p) {
  if (!p.expert_layout) return;
  Entry& e = entry(p);
  std::lock_guard<std::mutex> lock(e.mu);
  if (e.declined) return;
  write_back_regions(p, e);
  e.declined = true;
  std::lock_guard<std::mutex> stats_lock(mu_);
  ++stats_.declined;
}

void ExpertStagingPool::finish() {
  std::vector<std::pair<Parameter*, Entry*>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [p, e] : entries_) all.emplace_back(p, e.get());
  }
  std::vector<std::string> incomplete;
  for (auto& [p, e] : all) {
    std::lock_guard<std::mutex> lock(e->mu);
    if (e->flushed || e->declined) continue;
    write_back_regions(*p, *e);
    const ExpertLayout& layout = *p->expert_layout;
    incomplete.push_back(fmt::format("'{}': {} of {} (slot, shard) regions of its routed experts",
                                     p->name(), e->arrived.size(),
                                     layout.num_base * static_cast<int64_t>(layout.shards.size())));
  }
  if (incomplete.empty()) return;
  std::string list;
  for (const auto& s : incomplete) list += "\n  " + s;
  if (strict_)
    fail("{} expert parameter(s) did not receive every routed expert:{}\n(set "
         "ATOM_LOADER_STRICT_COVERAGE=false to load anyway, leaving those experts as initialised)",
         incomplete.size(), list);
  log_warn("{} expert parameter(s) did not receive every routed expert (loading anyway, "
           "ATOM_LOADER_STRICT_COVERAGE=false):{}",
           incomplete.size(), list);
}

ExpertStagingPool::Stats ExpertStagingPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace atom
