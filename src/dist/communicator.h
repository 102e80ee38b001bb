// Tensor-parallel communication. A Communicator is one rank's handle on its group.
// LocalGroup runs several ranks as threads of one process on the CPU; NcclGroup
// (dist/nccl_communicator.h) runs one rank per GPU; dist/comm_group.h picks between them.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/tensor.h"

namespace atom {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: x = sum over ranks of x. Float tensors, same shape on every rank.
  virtual void all_reduce_sum(Tensor& x) = 0;
  // out = concat over ranks of `in` along its last dimension; out is [..., size * in.last].
  virtual void all_gather_last_dim(const Tensor& in, Tensor& out) = 0;
};

// The single-rank communicator: every collective is the identity.
class SoloCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(Tensor&) override {}
  void all_gather_last_dim(const Tensor& in, Tensor& out) override;
};

// Shared state of `size` ranks that are threads of this process (CPU tensors only). With an
// exchange, only `local` ranks are threads here and the others live in other processes: once
// every local rank posted its tensor, the last to arrive calls exchange(slots), which sends the
// local ranks' slots to the other processes and fills the remote ones from theirs; then every
// rank computes the collective from all slots in rank order, so every process gets the same bits
// as one process with all the ranks (dist/nodes.h).
class LocalGroup {
 public:
  using Exchange = std::function<void(std::vector<Tensor>& slots)>;
  explicit LocalGroup(int size);
  LocalGroup(int size, std::vector<int> local, Exchange exchange);
  int size() const { return size_; }
  // The communicator for `rank`; the group must outlive it.
  std::unique_ptr<Communicator> communicator(int rank);
  // Makes every collective waiting now, and every later one, throw: a rank that failed will never
  // join them, so the others must not wait for it.
  void abort();

 private:
  friend class LocalCommunicator;
  // Blocks until all local ranks arrived (and, with exchange, the remote slots were filled);
  // throws once the group is aborted.
  void barrier(bool exchange = false);
  int size_;
  int local_count_;
  Exchange exchange_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  long generation_ = 0;
  bool aborted_ = false;
  std::vector<Tensor> slots_;  // each rank's contribution to the current collective
};

}  // namespace atom
