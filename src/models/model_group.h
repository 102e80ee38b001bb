// The model of every rank of this process, and what the ranks run on. With one rank it is one
// model built on the caller's thread: the single-device path, with no threads or communicators.
// With N = tp x pp ranks, rank r = stage x tp + t is tensor-parallel rank t of pipeline stage
// `stage`: it holds its stage's modules (models/model.h, ModelOptions::pp_rank) and its shards of
// them on its own device (cuda:r counted from the first device, or the CPU), runs on its own
// thread (RankThreads, which keeps that device current), reaches the other ranks of its stage
// through its communicator (NCCL between GPUs, a LocalGroup between CPU threads), and hands its
// stage's output to rank t of the next stage through a StageLink.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/comm_group.h"
#include "dist/nodes.h"
#include "dist/rank_threads.h"
#include "dist/stage_link.h"
#include "models/loading.h"

namespace atom {

class ModelGroup {
 public:
  ~ModelGroup();
  ModelGroup(const ModelGroup&) = delete;
  ModelGroup& operator=(const ModelGroup&) = delete;

  int tp_size() const { return tp_; }
  int pp_size() const { return pp_; }
  int world_size() const { return static_cast<int>(models_.size()); }
  // The rank whose model computes the logits: rank 0 of the last stage.
  int leader() const { return (pp_ - 1) * tp_; }
  // Whether any rank's layers keep recurrent state (a stage's own may not).
  bool recurrent() const;
  // The link rank r receives its stage's input from (null on the first stage) and the one it
  // sends its output to (null on the last).
  StageLink* link_in(int rank);
  StageLink* link_out(int rank);
  // Rank r's model (a rank of this process); model() answers for the group (config,
  // vocabulary): the leader's where this process holds it, else its first rank's.
  Model& model(int rank);
  const Model& model(int rank) const;
  Model& model() { return model(first_local()); }
  const Model& model() const { return model(first_local()); }
  // Whether rank r lives in this process (always, unless the group spans several nodes).
  bool holds(int rank) const {
    return rank >= 0 && rank < world_size() && models_[static_cast<size_t>(rank)] != nullptr;
  }
  // The first rank's loading report here (every rank reads the checkpoint for its own shards).
  const LoadReport& report() const { return report_; }
  // The ranks' threads: run(job) runs job(rank) on all of them at once. Null with one rank.
  RankThreads* threads() { return threads_.get(); }

  // Several nodes (dist/nodes.h): node 0, the head, serves and drives the others' ranks over
  // one control connection per node: it posts a command to all of them, runs its own ranks'
  // part, then collects one reply from each (a worker's error comes back as an Error naming the
  // node). A worker takes commands until the head says it is done (next_command() is empty).
  bool multi_node() const { return nodes_ != nullptr && nodes_->size() > 1; }
  // The group keeps the nodes it was loaded with (destroyed after everything else).
  void own_nodes(std::unique_ptr<Nodes> n) { owned_nodes_ = std::move(n); }
  bool is_worker() const { return multi_node() && nodes_->rank() != 0; }
  Nodes* nodes() { return nodes_; }
  void post(const std::string& command);
  std::vector<std::string> collect();
  std::optional<std::string> next_command();
  void reply(const std::string& payload, const std::string& error = {});
  // The largest of `value` over the nodes (the value itself with one node).
  int64_t max_over_nodes(const std::string& name, int64_t value);

 private:
  friend std::unique_ptr<ModelGroup> model_group_load(const std::string&, const ModelOptions&, int,
                                                      LoadFormat, Nodes*);
  ModelGroup() = default;
  int first_local() const;

  // Destroyed last to first: models, then the threads, then the communicators and links.
  std::unique_ptr<Nodes> owned_nodes_;
  Nodes* nodes_ = nullptr;
  std::vector<Socket> control_;  // the head: one per worker node (node n at n - 1); a worker: 1
  int tp_ = 1, pp_ = 1;
  bool recurrent_ = false;
  std::vector<std::unique_ptr<CommGroup>> comms_;  // one per stage
  // Data-parallel attention's groups of ModelOptions::attention_tp_size ranks (when more than 1).
  std::vector<std::unique_ptr<CommGroup>> attention_comms_;
  std::vector<std::unique_ptr<StageLink>> links_;  // stage s rank t -> stage s + 1: s * tp + t
  std::unique_ptr<RankThreads> threads_;
  std::vector<std::unique_ptr<Model>> models_;
  LoadReport report_;
};

// Loads `tp_size` x options.pp_size ranks of the model in model_dir. options.device is the first
// rank's device (rank r gets cuda:(index + r), or the CPU); the tp_rank/tp_size/comm and pp_rank
// fields are filled per rank. Errors name the problem: too few GPUs (with the count visible),
// heads or sizes not divisible, a model that cannot be split into stages.
// The command that asks every worker for its ranks' shards of the parameter `name`, and a
// worker's answer: (rank, tensor) for each of its ranks that holds it (the drafter gathers the
// target's embedding and head this way).
std::string model_group_shard_command(const std::string& name);
std::string model_group_shard_reply(ModelGroup& g, Wire& command);

// With `nodes` of several nodes, this process loads only the ranks node_of_rank places on it
// (CPU ranks so far); the nodes must be started with the same model and parallel flags.
std::unique_ptr<ModelGroup> model_group_load(const std::string& model_dir,
                                             const ModelOptions& options, int tp_size,
                                             LoadFormat format = LoadFormat::kAuto,
                                             Nodes* nodes = nullptr);

}  // namespace atom
