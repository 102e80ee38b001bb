#include "models/model_group.h"

#include "core/error.h"

namespace atom {

ModelGroup::~ModelGroup() {
  // Each rank's weights are released on its own thread, as they were made there.
  if (threads_) threads_->run([this](int r) { models_[static_cast<size_t>(r)].reset(); });
}

std::unique_ptr<ModelGroup> model_group_load(const std::string& model_dir,
                                             const ModelOptions& options, int tp_size,
                                             LoadFormat format) {
  if (tp_size < 1) fail("--tensor-parallel-size must be at least 1, got {}", tp_size);
  std::unique_ptr<ModelGroup> g(new ModelGroup);
  if (tp_size == 1) {
    LoadedModel m = model_load(model_dir, options, format);
    g->models_.push_back(std::move(m.model));
    g->report_ = std::move(m.report);
    return g;
  }
  const Device first = options.device;
  std::vector<Device> devices;
  for (int r = 0; r < tp_size; ++r)
    devices.push_back(first.is_cpu() ? Device::cpu() : Device::cuda(first.index + r));
  if (first.is_cuda()) {
    const int visible = cuda_device_count();
    if (first.index + tp_size > visible)
      fail("--tensor-parallel-size {} needs {} GPUs ({} to {}), but {} {} visible", tp_size,
           tp_size, devices.front().str(), devices.back().str(), visible,
           visible == 1 ? "is" : "are");
  }
  g->comms_ = comm_group_create(first, tp_size);
  g->threads_ = std::make_unique<RankThreads>(devices);
  g->threads_->set_failure_hook([c = g->comms_.get()] { c->abort(); });
  g->models_.resize(static_cast<size_t>(tp_size));
  g->threads_->run([&](int r) {
    ModelOptions o = options;
    o.device = devices[static_cast<size_t>(r)];
    o.tp_rank = r;
    o.tp_size = tp_size;
    o.comm = &g->comms_->communicator(r);
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
