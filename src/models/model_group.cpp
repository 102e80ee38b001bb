#include "models/model_group.h"

#include "core/error.h"

namespace atom {

ModelGroup::~ModelGroup() {
  // Each rank's weights are released on its own thread, as they were made there.
  if (threads_) threads_->run([this](int r) { models_[static_cast<size_t>(r)].reset(); });
}

bool ModelGroup::recurrent() const {
  for (const auto& m : models_)
    if (!m->state_specs().empty()) return true;
  return false;
}

StageLink* ModelGroup::link_in(int rank) {
  return rank < tp_ ? nullptr : links_.at(static_cast<size_t>(rank - tp_)).get();
}

StageLink* ModelGroup::link_out(int rank) {
  return rank >= leader() ? nullptr : links_.at(static_cast<size_t>(rank)).get();
}

std::unique_ptr<ModelGroup> model_group_load(const std::string& model_dir,
                                             const ModelOptions& options, int tp_size,
                                             LoadFormat format) {
  if (tp_size < 1) fail("--tensor-parallel-size must be at least 1, got {}", tp_size);
  const int pp = options.pp_size;
  if (pp < 1) fail("--pipeline-parallel-size must be at least 1, got {}", pp);
  std::unique_ptr<ModelGroup> g(new ModelGroup);
  g->tp_ = tp_size;
  g->pp_ = pp;
  const int world = tp_size * pp;
  if (world == 1) {
    LoadedModel m = model_load(model_dir, options, format);
    g->models_.push_back(std::move(m.model));
    g->report_ = std::move(m.report);
    return g;
  }
  const Device first = options.device;
  if (pp > 1 && first.is_cuda())
    fail("--pipeline-parallel-size {}: pipeline parallelism runs on CPU ranks only so far (the "
         "stages hand their tensors on through the host, and CUDA graphs and the memory profile do "
         "not take a stage's input yet)",
         pp);
  std::vector<Device> devices;
  for (int r = 0; r < world; ++r)
    devices.push_back(first.is_cpu() ? Device::cpu() : Device::cuda(first.index + r));
  if (first.is_cuda()) {
    const int visible = cuda_device_count();
    if (first.index + world > visible)
      fail("--tensor-parallel-size {} needs {} GPUs ({} to {}), but {} {} visible", tp_size, world,
           devices.front().str(), devices.back().str(), visible, visible == 1 ? "is" : "are");
  }
  for (int s = 0; s < pp; ++s)
    g->comms_.push_back(comm_group_create(devices[static_cast<size_t>(s * tp_size)], tp_size));
  for (int r = 0; r < (pp - 1) * tp_size; ++r) g->links_.push_back(std::make_unique<StageLink>());
  g->threads_ = std::make_unique<RankThreads>(devices);
  g->threads_->set_failure_hook([gp = g.get()] {
    for (auto& c : gp->comms_) c->abort();
    for (auto& l : gp->links_) l->abort();
  });
  g->models_.resize(static_cast<size_t>(world));
  g->threads_->run([&](int r) {
    const int stage = r / tp_size, t = r % tp_size;
    ModelOptions o = options;
    o.device = devices[static_cast<size_t>(r)];
    o.tp_rank = t;
    o.tp_size = tp_size;
    o.comm = &g->comms_[static_cast<size_t>(stage)]->communicator(t);
    o.pp_rank = stage;
    o.pp_size = pp;
    LoadedModel m = model_load(model_dir, o, format);
    // The loader's copy threads queue their uploads on the default stream of their current
    // device, cuda:0 (a new thread's), which later work on this rank's device does not wait for.
    if (o.device.is_cuda()) {
      device_synchronize(Device::cuda(0));
      device_synchronize(o.device);
    }
    g->models_[static_cast<size_t>(r)] = std::move(m.model);
    if (r == 0) g->report_ = std::move(m.report);
  });
  return g;
}

}  // namespace atom
