#include "models/draft_model.h"

#include <map>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/elementwise.h"

namespace atom {

Tensor DraftModel::forward(Step&) {
  fail("{}: a drafter runs through forward_draft, with the target's hidden states",
       config().architectures.at(0));
}

Tensor DraftModel::compute_logits(Step&, const Tensor&) {
  fail("{}: a drafter's logits come from compute_draft_logits", config().architectures.at(0));
}

Tensor mtp_concat_columns(Step& step, const Tensor& a, const Tensor& b) {
  const int64_t T = a.size(0), A = a.size(1);
  ATOM_CHECK(b.size(0) == T && b.size(1) == A && a.dtype() == b.dtype(),
             "mtp_concat_columns: {} and {}", a.str(), b.str());
  // Each half of the columns written in place (two strided row copies): no host data, so a
  // CUDA graph can capture it.
  Tensor out = step.empty({T, 2 * A}, a.dtype());
  Tensor left = out.narrow(1, 0, A), right = out.narrow(1, A, A);
  kernels::cast(left, a);
  kernels::cast(right, b);
  return out;
}

namespace {
std::map<std::string, DraftModelFactory>& drafters() {
  static std::map<std::string, DraftModelFactory> r;
  return r;
}
}  // namespace

void drafter_registry_add(const std::string& arch, DraftModelFactory factory) {
  if (drafters().count(arch)) fail("a drafter for '{}' is registered twice", arch);
  drafters()[arch] = std::move(factory);
}

std::vector<std::string> drafter_registry_list() {
  std::vector<std::string> r;
  for (const auto& [k, v] : drafters()) r.push_back(k);
  return r;
}

std::unique_ptr<DraftModel> drafter_create(const ModelConfig& config, const ModelOptions& options) {
  const std::string& arch = config.architectures.at(0);
  auto it = drafters().find(arch);
  if (it == drafters().end()) {
    std::string list;
    for (const auto& a : drafter_registry_list()) list += (list.empty() ? "" : ", ") + a;
    fail("{}: speculative decoding with method 'mtp' has no drafter for architecture '{}' (MTP "
         "drafters exist for: {})",
         config.path, arch, list);
  }
  return it->second(config, options);
}

LoadedDrafter drafter_load(const std::string& model_dir, Model& target, const ModelOptions& options,
                           LoadFormat format) {
  LoadedDrafter r;
  r.model = drafter_create(target.config(), options);
  DraftModel& d = *r.model;
  if (format == LoadFormat::kDummy) {
    model_fill_dummy(d);
  } else {
    WeightLoadSpec spec = d.weight_load_spec();
    ATOM_CHECK(spec.spec_decode && spec.spec_layer_rewrite,
               "{}: a drafter's weight_load_spec must set spec_decode and spec_layer_rewrite",
               target.config().architectures.at(0));
    Checkpoint ckpt(model_dir);
    // A config that names MTP layers the checkpoint lacks: said plainly, before the per-parameter
    // coverage report.
    CheckpointNameRewriter rewriter(spec.num_hidden_layers, spec.weights_mapping, true,
                                    spec.spec_layer_rewrite);
    bool any = false;
    for (const auto& [path, header] : ckpt.headers())
      for (const auto& e : header.entries) any = any || rewriter.rewrite(e.name).has_value();
    if (!any)
      fail("{}: the checkpoint carries no tensor of the {} drafter ({} MTP layer(s) expected): no "
           "MTP layer to draft with",
           model_dir, target.config().architectures.at(0), d.num_draft_layers());
    r.report = load_weights(d.params(), ckpt, spec, checkpoint_options_from_env());
  }
  // The tensors the drafter shares with the target unless the checkpoint carries its own.
  for (const auto& [mine, theirs] : d.shared_with_target()) {
    Parameter* p = d.params().find(mine);
    ATOM_CHECK(p, "drafter: shared parameter '{}' does not exist", mine);
    if (format != LoadFormat::kDummy && !p->received_nothing()) continue;
    Parameter* t = target.params().find(theirs);
    if (!t)
      fail("{}: the drafter's '{}' is not in the checkpoint and the target has no '{}' to share",
           model_dir, mine, theirs);
    if (t->data().shape() != p->data().shape() || t->data().dtype() != p->data().dtype())
      fail("{}: the drafter's '{}' {} cannot share the target's '{}' {}", model_dir, mine,
           p->data().str(), theirs, t->data().str());
    p->data() = t->data();
    r.shared.push_back(mine);
  }
  if (format != LoadFormat::kDummy) {
    const CheckpointStats& s = r.report.checkpoint;
    log_info("drafter {}: {} MTP layer(s), {} tensors from {} of {} shards ({} shards without an "
             "MTP tensor skipped from their headers), {} shared with the target",
             target.config().architectures.at(0), d.num_draft_layers(), r.report.tensors_loaded,
             s.shards_read, s.shards_total, s.shards_skipped, r.shared.size());
  }
  return r;
}

}  // namespace atom
