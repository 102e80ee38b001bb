#include "dist/rank_threads.h"

#include <algorithm>

#include "core/error.h"

namespace atom {

RankThreads::RankThreads(std::vector<Device> devices, std::vector<int> ranks)
    : devices_(std::move(devices)), ranks_(std::move(ranks)) {
  ATOM_CHECK(!devices_.empty(), "RankThreads needs at least one rank");
  if (ranks_.empty())
    for (int r = 0; r < size(); ++r) ranks_.push_back(r);
  ATOM_CHECK(ranks_.size() == devices_.size(), "{} ranks on {} devices", ranks_.size(),
             devices_.size());
  for (int r = 0; r < size(); ++r) threads_.emplace_back([this, r] { loop(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void RankThreads::loop(int rank) {
  bool device_set = false;
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || job_id_ != seen; });
      if (stop_) return;
      seen = job_id_;
      job = job_;
    }
    try {
      if (!device_set) {
        device_make_current(devices_[static_cast<size_t>(rank)]);
        device_set = true;
      }
      (*job)(ranks_[static_cast<size_t>(rank)]);
    } catch (...) {
      fail_rank(std::current_exception());
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

void RankThreads::fail_rank(std::exception_ptr e) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = !error_;
    if (first) error_ = e;
  }
  {
    std::lock_guard<std::mutex> lock(agree_mu_);
    agree_failed_ = true;
  }
  agree_cv_.notify_all();
  if (first && failure_hook_) failure_hook_();
}

void RankThreads::run(const std::function<void(int)>& job) {
  {
    std::lock_guard<std::mutex> lock(agree_mu_);
    agree_failed_ = false;
    agree_arrived_ = 0;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ATOM_CHECK(pending_ == 0, "RankThreads::run: a job is already running");
    job_ = &job;
    error_ = nullptr;
    pending_ = size();
    ++job_id_;
  }
  work_cv_.notify_all();
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

int RankThreads::min_over_ranks(int value) {
  std::unique_lock<std::mutex> lock(agree_mu_);
  if (agree_failed_) fail("another tensor-parallel rank failed");
  const uint64_t round = agree_round_;
  agree_min_ = agree_arrived_ == 0 ? value : std::min(agree_min_, value);
  if (++agree_arrived_ == size()) {
    agree_arrived_ = 0;
    if (agree_hook_) {
      try {
        agree_min_ = agree_hook_(agree_min_);
      } catch (...) {
        agree_failed_ = true;
        agree_cv_.notify_all();
        throw;
      }
    }
    agree_result_ = agree_min_;
    ++agree_round_;
    agree_cv_.notify_all();
    return agree_result_;
  }
  agree_cv_.wait(lock, [&] { return agree_round_ != round || agree_failed_; });
  if (agree_round_ == round) fail("another tensor-parallel rank failed");
  return agree_result_;
}

}  // namespace atom
