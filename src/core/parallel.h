// Exceptions and OpenMP: an exception may not leave a parallel region (the runtime calls
// std::terminate, killing a server over one bad request). A region runs each iteration's body
// through ParallelErrors::guard, which keeps the first exception any thread throws (and skips the
// remaining work once one has), and the caller rethrows it after the region:
//
//   ParallelErrors errors;
//   #pragma omp parallel for
//   for (int64_t i = 0; i < n; ++i) errors.guard([&] { ... ATOM_CHECK(...) ... });
//   errors.rethrow();
#pragma once

#include <atomic>
#include <exception>
#include <mutex>

namespace atom {

class ParallelErrors {
 public:
  template <class F>
  void guard(F&& body) noexcept {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      body();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!first_) first_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  // Throws the first exception guard() caught, if any. Call after the parallel region.
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mu_;
  std::exception_ptr first_;
};

}  // namespace atom
