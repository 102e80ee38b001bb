#include "loader/weight_loading.h"

#include <chrono>
#include <map>

#include "core/error.h"

namespace atom {

WeightDestination weight_destination(ParamRegistry& params, const CheckpointNameRewriter& rewriter,
                                     const WeightLoadSpec& spec, const std::string& ckpt_name) {
  WeightDestination d;
  const auto name = rewriter.rewrite(ckpt_name);
  if (!name) {
    d.kind = WeightDestination::kNotWanted;
    return d;
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
  // Route every tensor from the headers alone, so an unclaimed tensor fails before any data is read.
  std::map<std::string, WeightDestination> routes;
  std::vector<std::string> unclaimed;
  for (const auto& [path, header] : checkpoint.headers()) {
    for (const auto& e : header.entries) {
      if (routes.count(e.name)) continue;  // a duplicate copy; the index decides which is read
      WeightDestination d = weight_destination(params, rewriter, spec, e.name);
      if (d.kind == WeightDestination::kUnclaimed) unclaimed.push_back(e.name + "  (in " + path + ")");
      if (d.kind == WeightDestination::kIgnored) ++report.tensors_ignored;
      if (d.kind == WeightDestination::kNotWanted) ++report.tensors_not_wanted;
      routes.emplace(e.name, std::move(d));
    }
  }
  if (!unclaimed.empty())
    fail("{}: {} checkpoint tensor(s) match no parameter of this model:{}", checkpoint.dir(),
         unclaimed.size(), name_list(unclaimed));

  report.checkpoint = checkpoint.read(
      [&](const std::string& name) {
        auto it = routes.find(name);
        return it != routes.end() && it->second.kind == WeightDestination::kParam;
      },
      [&](const std::string& name, const Tensor& t) {
        const WeightDestination& d = routes.at(name);
        try {
          d.param->load(t, d.shard, d.expert);
        } catch (const Error& e) {
          fail("{}: loading tensor '{}': {}", checkpoint.dir(), name, e.what());
        }
      },
      options);
  report.tensors_loaded = report.checkpoint.tensors_yielded;

  std::vector<std::string> missing;
  for (const auto& [name, p] : params.all()) {
    if (p->optional && p->received_nothing()) continue;
    for (const auto& part : p->missing_parts())
      missing.push_back(part.empty() ? name : name + " (part " + part + ")");
  }
  if (!missing.empty())
    fail("{}: {} parameter(s) received no data from the checkpoint:{}", checkpoint.dir(),
         missing.size(), name_list(missing));

  params.run_post_load();
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace atom
