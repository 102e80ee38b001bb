#include "engine/tp_runner.h"

#include "core/error.h"

namespace atom {

namespace {
RankThreads& threads_of(ModelGroup& models) {
  ATOM_CHECK(models.world_size() > 1 && models.threads(),
             "TpRunner needs a group of more than one rank");
  return *models.threads();
}
}  // namespace

TpRunner::TpRunner(ModelGroup& models, const RunnerOptions& options)
    : models_(models),
      threads_(threads_of(models)),
      leader_(models.leader()),
      runners_(static_cast<size_t>(models.world_size())),
      copies_(static_cast<size_t>(models.world_size())) {
  RunnerOptions o = options;
  o.agree_pages = [this](int pages) { return threads_.min_over_ranks(pages); };
  try {
    threads_.run([&](int r) {
      RunnerOptions ro = o;
      ro.stage_in = models_.link_in(r);
      ro.stage_out = models_.link_out(r);
      if (models_.pp_size() > 1) ro.micro_batches = models_.pp_size();
      runners_[static_cast<size_t>(r)] = std::make_unique<ModelRunner>(models_.model(r), ro);
    });
  } catch (...) {
    threads_.run([this](int r) { runners_[static_cast<size_t>(r)].reset(); });
    throw;
  }
}

TpRunner::~TpRunner() {
  // Each rank's stream, graphs and cache are released on the thread whose device they are on.
  threads_.run([this](int r) { runners_[static_cast<size_t>(r)].reset(); });
}

void TpRunner::run_step(Batch& batch, const std::function<void(ModelRunner&)>& rank0) {
  // Copied here, before the ranks start: the leader writes into `batch` (its upload) while it
  // runs.
  for (int r = 0; r < ranks(); ++r)
    if (r != leader_) copies_[static_cast<size_t>(r)].copy_host_from(batch);
  threads_.run([&](int r) {
    if (r == leader_) {
      rank0(*runners_[static_cast<size_t>(r)]);
    } else {
      runners_[static_cast<size_t>(r)]->execute_forward(copies_[static_cast<size_t>(r)]);
    }
  });
}

Tensor TpRunner::execute(Batch& batch) {
  Tensor logits;
  run_step(batch, [&](ModelRunner& r) { logits = r.execute(batch); });
  return logits;
}

std::vector<int32_t> TpRunner::execute_greedy(Batch& batch) {
  std::vector<int32_t> ids;
  run_step(batch, [&](ModelRunner& r) { ids = r.execute_greedy(batch); });
  return ids;
}

void TpRunner::execute_sampling(Batch& batch, const StepSampling& want, StepSamples& out) {
  run_step(batch, [&](ModelRunner& r) { r.execute_sampling(batch, want, out); });
}

void TpRunner::capture_decode_graphs() {
  threads_.run([this](int r) { runners_[static_cast<size_t>(r)]->capture_decode_graphs(); });
}

int TpRunner::rebalance_experts() {
  std::vector<int> changed(runners_.size(), 0);
  threads_.run(
      [&](int r) { changed[static_cast<size_t>(r)] = models_.model(r).rebalance_experts(); });
  return changed[static_cast<size_t>(leader_)];
}

std::unique_ptr<StepRunner> step_runner_create(ModelGroup& models, const RunnerOptions& options) {
  if (models.world_size() == 1) return std::make_unique<ModelRunner>(models.model(0), options);
  return std::make_unique<TpRunner>(models, options);
}

}  // namespace atom
