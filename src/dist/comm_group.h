// The communicators of the tensor-parallel ranks that live in this process: threads sharing a
// LocalGroup on the CPU, or one NCCL communicator per GPU.
#pragma once

#include <memory>

#include "core/device.h"
#include "dist/communicator.h"

namespace atom {

class CommGroup {
 public:
  virtual ~CommGroup() = default;
  virtual int size() const = 0;
  // Rank r's communicator, owned by the group.
  virtual Communicator& communicator(int rank) = 0;
  // Ends every rank's pending collectives with an error and makes later ones fail: called when a
  // rank failed and will never join them. The group is unusable afterwards.
  virtual void abort() = 0;
};

// `size` ranks on the CPU (LocalGroup), or on GPUs first.index .. first.index + size - 1 (NCCL).
std::unique_ptr<CommGroup> comm_group_create(Device first, int size);

}  // namespace atom
