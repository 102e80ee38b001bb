// The communicators of the tensor-parallel ranks that live in this process: threads sharing a
// LocalGroup on the CPU, or one NCCL communicator per GPU.
#pragma once

#include <memory>
#include <string>
#include <vector>

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

class Nodes;
// A group whose ranks live on several nodes (dist/nodes.h): rank t is on node node_of[t]; this
// process holds those on nodes.rank(), as threads on the CPU. `name` names the group's channels
// (the same on every node). communicator(t) exists for the local ranks only.
std::unique_ptr<CommGroup> comm_group_create(Nodes& nodes, const std::string& name, Device first,
                                             const std::vector<int>& node_of);

}  // namespace atom
