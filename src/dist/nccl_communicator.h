// NCCL communicators for the tensor-parallel ranks of this process, one GPU each. Collectives run
// on the calling thread's current stream (core/cuda_stream.h), so a decode CUDA graph captured on
// a runner's stream records them too. Built only when NCCL is found (ATOM_HAVE_NCCL).
//
// NVLink SHARP (NVLS) needs multicast objects; atom leaves it off: NCCL_NVLS_ENABLE defaults to 0
// here unless the environment sets it.
#pragma once

#include <memory>
#include <vector>

#include "dist/comm_group.h"

namespace atom {

class NcclCommunicator;

class NcclGroup final : public CommGroup {
 public:
  // Rank r on GPU devices[r]; the communicators are made together (ncclCommInitAll) by the
  // calling thread.
  explicit NcclGroup(const std::vector<int>& devices);
  // Each communicator is destroyed on a thread of its own: NCCL's finalisation waits for every
  // rank of the group, so destroying them one after another from one thread could wait forever.
  ~NcclGroup() override;

  int size() const override { return static_cast<int>(comms_.size()); }
  Communicator& communicator(int rank) override;
  void abort() override;

 private:
  std::vector<std::unique_ptr<NcclCommunicator>> comms_;
};

}  // namespace atom
