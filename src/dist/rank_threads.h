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
  // Rank r runs on devices[r].
  explicit RankThreads(std::vector<Device> devices);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return static_cast<int>(devices_.size()); }
  Device device(int rank) const { return devices_.at(static_cast<size_t>(rank)); }

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
  std::function<void()> failure_hook_;
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
