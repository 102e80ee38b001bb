// Runs the ranks of a tensor- and pipeline-parallel group (models/model_group.h) in lockstep.
// Every step's Batch goes to every rank; rank r runs it on its own thread with its own
// ModelRunner (device, stream, step arena, KV cache of its stage's layers and its kv heads,
// decode graphs), the collectives inside forward() tie a stage's ranks together and the stage
// links hand each stage's output to the next, and the leader's logits (rank 0 of the last stage)
// are the step's: it samples them and copies out what the host needs, while the other ranks only
// run their share of the forward pass. With pipeline stages a step of several sequences runs as
// micro-batches (RunnerOptions::micro_batches), so that the stages overlap within the step.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/error.h"
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
  std::vector<int> graph_buckets() const override {
    return runners_[static_cast<size_t>(leader_)]->graph_buckets();
  }
  int block_size() const override { return lead().block_size(); }
  // Data-parallel attention: every rank's pages, rank r's the partition r.
  int num_pages() const override { return lead().num_pages() * dp_; }
  int page_partitions() const override { return dp_; }
  int max_model_len() const override { return lead().max_model_len(); }
  int rebalance_experts() override;
  // The leader's hidden states of the last step (speculative decoding's drafter reads them: after
  // the tensor-parallel all-reduces every rank of the last stage holds them whole).
  Tensor last_hidden() const override {
    return runners_[static_cast<size_t>(leader_)]->last_hidden();
  }

  // Every rank of the group (tensor x pipeline).
  int ranks() const { return static_cast<int>(runners_.size()); }
  ModelRunner& rank(int r) { return *runners_.at(static_cast<size_t>(r)); }

 private:
  friend void tp_runner_follow(ModelGroup& models);
  // The leader's runner (the head node holds it); on a worker, its first rank's.
  const ModelRunner& lead() const {
    for (size_t r = static_cast<size_t>(leader_); r < runners_.size(); ++r)
      if (runners_[r]) return *runners_[r];
    for (const auto& r : runners_)
      if (r) return *r;
    fail("TpRunner: no rank in this process");
  }
  // Copies the step to every rank but the leader, then runs rank0(batch) on the leader and a
  // forward pass on every other rank, all at once (on a worker node: every rank of the node).
  void run_step(Batch& batch, const std::function<void(ModelRunner&)>& rank0);
  // On the head of several nodes: posts `command` to the workers, runs `local`, and collects
  // their replies (the first error wins, this node's before the workers'). Elsewhere: local().
  void on_all_nodes(const std::string& command, const std::function<void()>& local);

  ModelGroup& models_;
  RankThreads& threads_;
  int leader_;
  int dp_ = 1;  // data-parallel attention ranks (the tensor-parallel ranks), else 1
  bool head_;   // the head of several nodes: commands go to the workers
  std::vector<std::unique_ptr<ModelRunner>> runners_;
  // Every rank but the leader uploads its own copy of the step: a Batch holds its device views.
  std::vector<Batch> copies_;
};

// A ModelRunner for a one-rank group, else a TpRunner.
std::unique_ptr<StepRunner> step_runner_create(ModelGroup& models, const RunnerOptions& options);

// A worker node's part of a run over several nodes (models.is_worker()): takes the head's
// commands (the KV plan's questions, building the runners, every step, graph capture, expert
// re-placement) and runs them on this node's ranks until the head is done or gone. A command
// that fails is answered with its error and the worker goes on with the next.
void tp_runner_follow(ModelGroup& models);

// The step's host fields as bytes, and back (the head sends each step to the workers).
std::string batch_to_bytes(const Batch& b);
void batch_from_bytes(Wire& w, Batch& b);

}  // namespace atom
