#include "models/draft_model.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "core/convert.h"
#include "kernels/elementwise.h"
#include "models/model_group.h"

namespace atom {

Tensor DraftModel::forward(Step&) {
  fail("{}: a drafter runs through forward_draft, with the target's hidden states",
       config().architectures.at(0));
}

Tensor DraftModel::compute_logits(Step&, const Tensor&) {
  fail("{}: a drafter's logits come from compute_draft_logits", config().architectures.at(0));
}

Tensor BlockDraftModel::forward_draft(Step&, const Tensor&, int) {
  fail("{}: a block drafter ({}) drafts through absorb and draft_block",
       config().architectures.at(0), method());
}

Tensor BlockDraftModel::compute_draft_logits(Step&, const Tensor&, int) {
  fail("{}: a block drafter ({}) drafts through absorb and draft_block",
       config().architectures.at(0), method());
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
    fail("{}: speculative decoding has no drafter for architecture '{}' (MTP or DSpark "
         "drafters exist for: {})",
         config.path, arch, list);
  }
  return it->second(config, options);
}

namespace {

// Where a shared tensor comes from: the target's own (one rank), or gathered from a group.
using SharedSource = std::function<Tensor(const std::string& theirs, const Tensor& mine)>;

LoadedDrafter drafter_load_impl(const std::string& model_dir, Model& target,
                                const ModelOptions& options, LoadFormat format,
                                const SharedSource& gather);

// The rows of the vocabulary-parallel tensor `name` (embedding or LM head: rank t of a stage
// holds rows [t rows, (t + 1) rows) of the padded vocabulary) from the tensor-parallel ranks of
// the stage holding it, into a tensor shaped like `mine` on its device. Undefined when no rank
// holds `name`.
Tensor gather_vocab_rows(ModelGroup& g, const std::string& name, const Tensor& mine) {
  const int tp = g.tp_size();
  // Every rank's shard of `name`: this process's, and over several nodes the workers' (their
  // answers to a "shard" command, engine/tp_runner.h).
  std::map<int, Tensor> shards;
  for (int r = 0; r < g.world_size(); ++r)
    if (g.holds(r))
      if (Parameter* p = g.model(r).params().find(name)) shards[r] = p->data();
  if (g.multi_node()) {
    g.post(model_group_shard_command(name));
    for (const std::string& reply : g.collect()) {
      Wire w(reply);
      while (!w.done()) {
        const auto r = static_cast<int>(w.i64());
        shards[r] = wire_tensor(w);
      }
    }
  }
  if (shards.empty()) return Tensor();
  const int stage = shards.begin()->first / tp;
  Tensor full = Tensor::zeros(mine.shape(), mine.dtype());
  const int64_t width = mine.size(1), bytes = width * dtype_bytes(mine.dtype(), 1);
  for (int t = 0; t < tp; ++t) {
    const auto it = shards.find(stage * tp + t);
    const Tensor* p = it == shards.end() ? nullptr : &it->second;
    ATOM_CHECK(p && p->dim() == 2 && p->size(1) == width,
               "drafter: rank {} holds {} as {}, not rows of {}", stage * tp + t, name,
               p ? p->str() : std::string("nothing"), width);
    const Tensor shard = tensor_cast_cpu(*p, mine.dtype());
    const int64_t rows = shard.size(0), start = t * rows;
    const int64_t n = std::max<int64_t>(0, std::min(rows, mine.size(0) - start));
    std::memcpy(static_cast<char*>(full.data()) + start * bytes, shard.data(),
                static_cast<size_t>(n * bytes));
  }
  Tensor out = Tensor::empty(mine.shape(), mine.dtype(), mine.device());
  tensor_assign(out, full);
  return out;
}

}  // namespace

LoadedDrafter drafter_load(const std::string& model_dir, Model& target, const ModelOptions& options,
                           LoadFormat format) {
  return drafter_load_impl(model_dir, target, options, format,
                           [&target](const std::string& theirs, const Tensor&) {
                             Parameter* t = target.params().find(theirs);
                             return t ? t->data() : Tensor();
                           });
}

LoadedDrafter drafter_load(const std::string& model_dir, ModelGroup& targets,
                           const ModelOptions& options, LoadFormat format) {
  if (targets.world_size() == 1) return drafter_load(model_dir, targets.model(), options, format);
  ATOM_CHECK(options.tp_size == 1, "drafter: built whole on the leader, not over {} ranks",
             options.tp_size);
  return drafter_load_impl(model_dir, targets.model(targets.leader()), options, format,
                           [&targets](const std::string& theirs, const Tensor& mine) {
                             return gather_vocab_rows(targets, theirs, mine);
                           });
}

namespace {

LoadedDrafter drafter_load_impl(const std::string& model_dir, Model& target,
                                const ModelOptions& options, LoadFormat format,
                                const SharedSource& gather) {
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
    const Tensor t = gather(theirs, p->data());
    if (!t.defined())
      fail("{}: the drafter's '{}' is not in the checkpoint and the target has no '{}' to share",
           model_dir, mine, theirs);
    if (t.shape() != p->data().shape() || t.dtype() != p->data().dtype())
      fail("{}: the drafter's '{}' {} cannot share the target's '{}' {}", model_dir, mine,
           p->data().str(), theirs, t.str());
    p->data() = t;
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

}  // namespace

}  // namespace atom
