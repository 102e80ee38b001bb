#include "dist/comm_group.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/nodes.h"

#ifdef ATOM_HAVE_NCCL
#include "dist/nccl_communicator.h"
#endif

namespace atom {

namespace {

class LocalCommGroup final : public CommGroup {
 public:
  explicit LocalCommGroup(int size) : group_(size) {
    for (int r = 0; r < size; ++r) comms_.push_back(group_.communicator(r));
  }
  int size() const override { return group_.size(); }
  Communicator& communicator(int rank) override { return *comms_.at(static_cast<size_t>(rank)); }
  void abort() override { group_.abort(); }

 private:
  LocalGroup group_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

// The ranks of this node, with a connection to every other node that holds ranks of the group.
class NodesCommGroup final : public CommGroup {
 public:
  NodesCommGroup(Nodes& nodes, const std::string& name, const std::vector<int>& node_of)
      : node_of_(node_of),
        group_(static_cast<int>(node_of.size()), local_ranks(nodes, node_of),
               [this](std::vector<Tensor>& slots) { exchange(slots); }) {
    std::vector<int> peers;
    for (int n : node_of)
      if (n != nodes.rank() && std::find(peers.begin(), peers.end(), n) == peers.end())
        peers.push_back(n);
    std::sort(peers.begin(), peers.end());
    for (int n : peers) peers_.emplace_back(n, nodes.connect("comm/" + name, n));
    comms_.resize(node_of.size());
    for (int t = 0; t < static_cast<int>(node_of.size()); ++t)
      if (node_of[static_cast<size_t>(t)] == nodes.rank())
        comms_[static_cast<size_t>(t)] = group_.communicator(t);
  }
  int size() const override { return group_.size(); }
  Communicator& communicator(int rank) override {
    ATOM_CHECK(rank >= 0 && rank < size() && comms_[static_cast<size_t>(rank)],
               "rank {} of this group lives on node {}", rank,
               node_of_.at(static_cast<size_t>(rank)));
    return *comms_[static_cast<size_t>(rank)];
  }
  void abort() override {
    // A rank blocked in an exchange wakes with an error; the peers see the connection end.
    for (auto& [n, s] : peers_) s.shutdown();
    group_.abort();
  }

 private:
  static std::vector<int> local_ranks(Nodes& nodes, const std::vector<int>& node_of) {
    std::vector<int> local;
    for (int t = 0; t < static_cast<int>(node_of.size()); ++t)
      if (node_of[static_cast<size_t>(t)] == nodes.rank()) local.push_back(t);
    ATOM_CHECK(!local.empty(), "a group with no rank on this node");
    return local;
  }

  // Sends this node's slots to every peer (each on a thread of its own, so that two nodes
  // sending large tensors to each other do not both wait for the other to read) and fills the
  // slots of the peers' ranks from theirs.
  void exchange(std::vector<Tensor>& slots) {
    Wire mine;
    for (size_t t = 0; t < slots.size(); ++t) {
      if (!comms_[t]) continue;
      mine.put_i64(static_cast<int64_t>(t));
      wire_put_tensor(mine, slots[t]);
    }
    std::vector<std::thread> senders;
    std::vector<std::exception_ptr> errors(peers_.size());
    for (size_t i = 0; i < peers_.size(); ++i)
      senders.emplace_back([&, i] {
        try {
          peers_[i].second.send_frame(mine.buffer());
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    std::exception_ptr error;
    try {
      for (auto& [n, s] : peers_) {
        std::string frame;
        try {
          frame = s.recv_frame();
        } catch (const Error& e) {
          fail("a group's ranks on node {} left (their node failed or ended): {}", n, e.what());
        }
        Wire theirs(std::move(frame));
        while (!theirs.done()) {
          const int64_t t = theirs.i64();
          if (t < 0 || t >= static_cast<int64_t>(slots.size()) ||
              node_of_[static_cast<size_t>(t)] != n)
            fail("node {} sent the tensor of rank {}, which is not its own", n, t);
          slots[static_cast<size_t>(t)] = wire_tensor(theirs);
        }
      }
    } catch (...) {
      error = std::current_exception();
      for (auto& [n, s] : peers_) s.shutdown();  // a sender blocked on a full buffer wakes
    }
    for (auto& t : senders) t.join();
    if (error) std::rethrow_exception(error);
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

  std::vector<int> node_of_;
  std::vector<std::pair<int, Socket>> peers_;
  LocalGroup group_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

}  // namespace

std::unique_ptr<CommGroup> comm_group_create(Nodes& nodes, const std::string& name, Device first,
                                             const std::vector<int>& node_of) {
  if (!first.is_cpu())
    fail("ranks on several nodes run on CPU ranks only so far ({} asked for): NCCL's bootstrap "
         "over --master-addr is not written yet",
         first.str());
  return std::make_unique<NodesCommGroup>(nodes, name, node_of);
}

std::unique_ptr<CommGroup> comm_group_create(Device first, int size) {
  ATOM_CHECK(size >= 1, "communicator group of {} ranks", size);
  if (first.is_cpu()) return std::make_unique<LocalCommGroup>(size);
#ifdef ATOM_HAVE_NCCL
  std::vector<int> devices;
  for (int r = 0; r < size; ++r) devices.push_back(first.index + r);
  return std::make_unique<NcclGroup>(devices);
#else
  fail("tensor parallelism on {} needs NCCL, and this build of atom has none", first.str());
#endif
}

}  // namespace atom
