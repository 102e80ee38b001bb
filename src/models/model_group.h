// The model of every tensor-parallel rank of this process, and what the ranks run on. With one
// rank it is one model built on the caller's thread: the single-device path, with no threads or
// communicators. With N ranks, rank r holds its shards of the weights on its own device (cuda:r
// counted from the first device, or the CPU), runs on its own thread (RankThreads, which keeps
// that device current), and reaches the other ranks through its communicator (NCCL between GPUs,
// a LocalGroup between CPU threads).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/comm_group.h"
#include "dist/rank_threads.h"
#include "models/loading.h"

namespace atom {

class ModelGroup {
 public:
  ~ModelGroup();
  ModelGroup(const ModelGroup&) = delete;
  ModelGroup& operator=(const ModelGroup&) = delete;

  int tp_size() const { return static_cast<int>(models_.size()); }
  // Rank r's model; rank 0's answers for the group (config, vocabulary, cache shapes per rank).
  Model& model(int rank = 0) { return *models_.at(static_cast<size_t>(rank)); }
  const Model& model(int rank = 0) const { return *models_.at(static_cast<size_t>(rank)); }
  // Rank 0's loading report (every rank reads the checkpoint for its own shards).
  const LoadReport& report() const { return report_; }
  // The ranks' threads: run(job) runs job(rank) on all of them at once. Null with one rank.
  RankThreads* threads() { return threads_.get(); }

 private:
  friend std::unique_ptr<ModelGroup> model_group_load(const std::string&, const ModelOptions&, int,
                                                      LoadFormat);
  ModelGroup() = default;

  // Destroyed last to first: models, then the threads, then the communicators.
  std::unique_ptr<CommGroup> comms_;
  std::unique_ptr<RankThreads> threads_;
  std::vector<std::unique_ptr<Model>> models_;
  LoadReport report_;
};

// Loads `tp_size` ranks of the model in model_dir. options.device is the first rank's device
// (rank r gets cuda:(index + r), or the CPU); the tp_rank/tp_size/comm fields are filled per rank.
// Errors name the problem: too few GPUs (with the count visible), heads or sizes not divisible.
std::unique_ptr<ModelGroup> model_group_load(const std::string& model_dir,
                                             const ModelOptions& options, int tp_size,
                                             LoadFormat format = LoadFormat::kAuto);

}  // namespace atom
