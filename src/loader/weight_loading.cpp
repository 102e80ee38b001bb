#include "loader/weight_loading.h"

#include <chrono>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "loader/expert_staging.h"

namespace atom {

ExpertMappingIndex::ExpertMappingIndex(const std::vector<ExpertParamMapping>& mapping) {
  for (const auto& m : mapping) {
    ATOM_CHECK(!m.ckpt.empty(), "expert mapping entry for '{}' has no checkpoint name", m.param);
    by_ckpt_[m.ckpt] = &m;
    heads_.insert(m.ckpt.substr(0, m.ckpt.find('.')));
  }
}

const ExpertParamMapping* ExpertMappingIndex::match(const std::string& name,
                                                    std::string* param_name) const {
  if (by_ckpt_.empty()) return nullptr;
  for (size_t pos = 0; pos < name.size();) {
    const size_t dot = name.find('.', pos);
    const size_t end = dot == std::string::npos ? name.size() : dot;
    if (heads_.count(name.substr(pos, end - pos))) {
      // Keys are whole components from here: "experts.3.gate_proj." (more follows) or
      // "experts.gate_up_proj" (the name's end).
      for (size_t e = end; e <= name.size();) {
        const bool last = e == name.size();
        const std::string key = last ? name.substr(pos) : name.substr(pos, e - pos + 1);
        auto it = by_ckpt_.find(key);
        if (it != by_ckpt_.end()) {
          *param_name = name.substr(0, pos) + it->second->param + name.substr(pos + key.size());
          return it->second;
        }
        if (last) break;
        const size_t next = name.find('.', e + 1);
        e = next == std::string::npos ? name.size() : next;
      }
    }
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return nullptr;
}

WeightDestination weight_destination(ParamRegistry& params, const CheckpointNameRewriter& rewriter,
                                     const WeightLoadSpec& spec, const std::string& ckpt_name,
                                     const ExpertMappingIndex* experts) {
  WeightDestination d;
  const auto name = rewriter.rewrite(ckpt_name);
  if (!name) {
    d.kind = WeightDestination::kNotWanted;
    return d;
  }
  if (params.in_missing_module(*name)) {
    d.kind = WeightDestination::kOtherStage;
    return d;
  }
  std::string expert_param;
  if (const ExpertParamMapping* m = experts ? experts->match(*name, &expert_param) : nullptr) {
    if (Parameter* p = params.find(expert_param)) {
      d.kind = m->expert >= 0 && p->holds_expert && !p->holds_expert(m->expert)
                   ? WeightDestination::kOtherRank
                   : WeightDestination::kParam;
      d.param = p;
      d.shard = m->shard;
      d.expert = m->expert;
      return d;
    }
  }
  for (const auto& pm : spec.packed_modules) {
    const auto fused = weight_name_replace_component(*name, pm.ckpt, pm.param);
    if (!fused) continue;
    if (Parameter* p = params.find(*fused)) {
      d.kind = WeightDestination::kParam;
      d.param = p;
      d.shard = pm.shard;
      return d;
    }
  }
  if (Parameter* p = params.find(*name)) {
    d.kind = WeightDestination::kParam;
    d.param = p;
    return d;
  }
  if (spec.ignorable && spec.ignorable(*name)) {
    d.kind = WeightDestination::kIgnored;
    return d;
  }
  return d;
}

namespace {
std::string name_list(const std::vector<std::string>& names) {
  std::string s;
  const size_t shown = std::min<size_t>(names.size(), 20);
  for (size_t i = 0; i < shown; ++i) s += "\n  " + names[i];
  if (names.size() > shown) s += fmt::format("\n  ... and {} more", names.size() - shown);
  return s;
}
}  // namespace

LoadReport load_weights(ParamRegistry& params, const Checkpoint& checkpoint,
                        const WeightLoadSpec& spec, const CheckpointReadOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  LoadReport report;
  CheckpointNameRewriter rewriter(spec.num_hidden_layers, spec.weights_mapping, spec.spec_decode,
                                  spec.spec_layer_rewrite);
  const ExpertMappingIndex experts(spec.expert_mapping);
  const bool strict = loader_strict_coverage_from_env();
  // Batched expert staging with the parallel loader; one thread sends every expert through its
  // parameter's own loader.
  std::unique_ptr<ExpertStagingPool> pool;
  if (options.num_threads > 1) pool = std::make_unique<ExpertStagingPool>(strict);
  // Route every tensor from the headers alone, so an unclaimed tensor fails before any data is
  // read.
  std::map<std::string, WeightDestination> routes;
  std::vector<std::string> unclaimed;
  for (const auto& [path, header] : checkpoint.headers()) {
    for (const auto& e : header.entries) {
      if (routes.count(e.name)) continue;  // a duplicate copy; the index decides which is read
      WeightDestination d = weight_destination(params, rewriter, spec, e.name, &experts);
      if (d.kind == WeightDestination::kUnclaimed)
        unclaimed.push_back(e.name + "  (in " + path + ")" +
                            (e.name.ends_with("weight_scale") ||
                                     e.name.ends_with("weight_scale_inv") ||
                                     e.name.ends_with("input_scale")
                                 ? "  (a quantisation scale of a layer that this model or the "
                                   "quantization_config keeps unquantised)"
                                 : ""));
      if (d.kind == WeightDestination::kIgnored) ++report.tensors_ignored;
      if (d.kind == WeightDestination::kNotWanted) ++report.tensors_not_wanted;
      if (d.kind == WeightDestination::kOtherRank) {
        ++report.tensors_other_ranks;
        report.bytes_other_ranks += e.nbytes();
      }
      if (d.kind == WeightDestination::kOtherStage) {
        ++report.tensors_other_stages;
        report.bytes_other_stages += e.nbytes();
      }
      routes.emplace(e.name, std::move(d));
    }
  }
  if (!unclaimed.empty())
    fail("{}: {} checkpoint tensor(s) match no parameter of this model:{}", checkpoint.dir(),
         unclaimed.size(), name_list(unclaimed));
  if (spec.check_names) {
    std::vector<std::string> names;
    for (const auto& [name, d] : routes) names.push_back(name);
    try {
      spec.check_names(names);
    } catch (const Error& e) {
      fail("{}: {}", checkpoint.dir(), e.what());
    }
  }

  report.checkpoint = checkpoint.read(
      [&](const std::string& name) {
        auto it = routes.find(name);
        return it != routes.end() && it->second.kind == WeightDestination::kParam;
      },
      [&](const std::string& name, const Tensor& t) {
        const WeightDestination& d = routes.at(name);
        try {
          if (pool && pool->owns(*d.param, d.expert, d.shard)) {
            pool->stage(*d.param, t, d.shard, d.expert);
          } else {
            // A stacked tensor, or an expert's part in a format of the model's own (MXFP4
            // packing), writes regions the pool may have staged: it takes the parameter over
            // first.
            if (pool && d.param->expert_layout &&
                (d.expert < 0 || !d.param->expert_layout->has_shard(d.shard)))
              pool->decline(*d.param);
            d.param->load(t, d.shard, d.expert);
          }
        } catch (const Error& e) {
          fail("{}: loading tensor '{}': {}", checkpoint.dir(), name, e.what());
        }
      },
      options);
  report.tensors_loaded = report.checkpoint.tensors_yielded;
  if (pool) {
    pool->finish();
    report.expert_bulk_copies = pool->stats().bulk_copies;
    report.expert_region_copies = pool->stats().region_copies;
  }

  std::vector<std::string> missing, missing_experts;
  for (const auto& [name, p] : params.all()) {
    if (p->optional && p->received_nothing()) continue;
    for (const auto& part : p->missing_parts()) {
      const std::string what = part.empty() ? name : name + " (part " + part + ")";
      // ATOM_LOADER_STRICT_COVERAGE=false: missing experts load anyway, as initialised.
      (!strict && part.starts_with("expert ") ? missing_experts : missing).push_back(what);
    }
  }
  if (!missing_experts.empty())
    log_warn("{}: {} expert part(s) received no data; left as initialised "
             "(ATOM_LOADER_STRICT_COVERAGE=false):{}",
             checkpoint.dir(), missing_experts.size(), name_list(missing_experts));
  if (!missing.empty())
    fail("{}: {} parameter(s) received no data from the checkpoint:{}", checkpoint.dir(),
         missing.size(), name_list(missing));

  params.run_post_load();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace atom
