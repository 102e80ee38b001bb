#include "dist/comm_group.h"

#include <vector>

#include "core/error.h"

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

}  // namespace

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
