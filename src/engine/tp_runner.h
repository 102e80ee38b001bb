// Runs the ranks of a tensor-parallel group in lockstep. Every step's Batch goes to every rank;
// rank r runs it on its own thread with its own ModelRunner (device, stream, step arena, KV cache
// shard of its kv heads, decode graphs), the collectives inside forward() tie the ranks together,
// and rank 0's logits are the step's: it samples them and copies out what the host needs, while
// the other ranks only run their share of the forward pass.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/model_runner.h"
#include "models/model_group.h"

namespace atom {

class TpRunner final : public StepRunner {
 public:
  // Builds every rank's ModelRunner at once on the ranks' threads: each sizes its KV cache from
  // its own device (the sizing step runs the model, so all ranks must run it together) and all
  // keep the smallest page count. models must have more than one rank and outlive the runner.
  TpRunner(ModelGroup& models, const RunnerOptions& options);
  ~TpRunner() override;
  TpRunner(const TpRunner&) = delete;
  TpRunner& operator=(const TpRunner&) = delete;

  Tensor execute(Batch& batch) override;
  std::vector<int32_t> execute_greedy(Batch& batch) override;
  void execute_sampling(Batch& batch, const StepSampling& want, StepSamples& out) override;
  void capture_decode_graphs() override;
  std::vector<int> graph_buckets() const override { return runners_[0]->graph_buckets(); }
  int block_size() const override { return runners_[0]->block_size(); }
  int num_pages() const override { return runners_[0]->num_pages(); }
  int max_model_len() const override { return runners_[0]->max_model_len(); }
  int rebalance_experts() override;

  int tp_size() const { return static_cast<int>(runners_.size()); }
  ModelRunner& rank(int r) { return *runners_.at(static_cast<size_t>(r)); }

 private:
  // Copies the step to ranks 1.., then runs rank0(batch) on rank 0 and a forward pass on every
  // other rank, all at once.
  void run_step(Batch& batch, const std::function<void(ModelRunner&)>& rank0);

  ModelGroup& models_;
  RankThreads& threads_;
  std::vector<std::unique_ptr<ModelRunner>> runners_;
  // Ranks 1..N-1 each upload their own copy of the step: a Batch holds its device views.
  std::vector<Batch> copies_;
};

// A ModelRunner for a one-rank group, else a TpRunner.
std::unique_ptr<StepRunner> step_runner_create(ModelGroup& models, const RunnerOptions& options);

}  // namespace atom
