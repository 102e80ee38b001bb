// The threads of the tensor-parallel ranks of this process, one each. Thread r makes its device
// current once (the current CUDA device belongs to a thread) and runs rank r's part of every job;
// run() returns when all ranks are done. The ranks of a step must run at the same time because
// their collectives wait for each other, which is why each has a thread of its own.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/device.h"

namespace atom {

class RankThreads {
 public:
  // Rank r runs on devices[r]. With `ranks`, the threads are those of ranks[i] (on devices[i]),
  // this process's share of a group spread over several nodes (dist/nodes.h): jobs get the
  // global rank.
  explicit RankThreads(std::vector<Device> devices, std::vector<int> ranks = {});
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  // The ranks of this process.
  int size() const { return static_cast<int>(devices_.size()); }
  const std::vector<int>& ranks() const { return ranks_; }

  // min_over_ranks' agreement with the ranks of other processes: called on one thread with this
  // process's minimum, it returns the minimum over all of them.
  void set_agree_hook(std::function<int(int)> hook) { agree_hook_ = std::move(hook); }

  // Called on the thread of the first rank that fails, while the others may still wait in a
  // collective the failed rank will never join: it aborts their communicator group.
  void set_failure_hook(std::function<void()> hook) { failure_hook_ = std::move(hook); }

  // Runs job(rank) on every rank's thread and waits for all of them; rethrows the first error.
  // One job at a time (the engine's thread drives the ranks).
  void run(const std::function<void(int rank)>& job);

  // Inside a job, every rank passes its value and all get the smallest (host-side agreement, e.g.
  // on how many KV pages every rank can hold). Throws when another rank failed instead.
  int min_over_ranks(int value);

 private:
  void loop(int rank);
  void fail_rank(std::exception_ptr e);

  std::vector<Device> devices_;
  std::vector<int> ranks_;
  std::function<void()> failure_hook_;
  std::function<int(int)> agree_hook_;
  std::vector<std::thread> threads_;

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t job_id_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;  // the first failure of the current job

  std::mutex agree_mu_;
  std::condition_variable agree_cv_;
  int agree_arrived_ = 0;
  uint64_t agree_round_ = 0;
  int agree_min_ = 0, agree_result_ = 0;
  bool agree_failed_ = false;
};

}  // namespace atom
