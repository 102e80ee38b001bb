#include "models/model_group.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"

namespace atom {

ModelGroup::~ModelGroup() {
  // The head tells the workers it is done (an empty command); they may be gone already.
  if (multi_node() && !is_worker()) {
    for (Socket& s : control_) {
      try {
        s.send_frame("");
      } catch (const Error&) {
      }
    }
  }
  // Each rank's weights are released on its own thread, as they were made there.
  if (threads_) threads_->run([this](int r) { models_[static_cast<size_t>(r)].reset(); });
}

Model& ModelGroup::model(int rank) {
  ATOM_CHECK(holds(rank), "rank {} of {} is not in this process (node {})", rank, world_size(),
             nodes_ ? nodes_->rank() : 0);
  return *models_[static_cast<size_t>(rank)];
}

const Model& ModelGroup::model(int rank) const {
  return const_cast<ModelGroup*>(this)->model(rank);
}

int ModelGroup::first_local() const {
  for (int r = 0; r < world_size(); ++r)
    if (holds(r)) return r;
  fail("a model group with no rank in this process");
}

bool ModelGroup::recurrent() const { return recurrent_; }

int64_t ModelGroup::max_over_nodes(const std::string& name, int64_t value) {
  return multi_node() ? nodes_->max_over_nodes(name, value) : value;
}

void ModelGroup::post(const std::string& command) {
  ATOM_CHECK(multi_node() && !is_worker(), "only the head node posts commands");
  for (Socket& s : control_) s.send_frame(command);
}

std::vector<std::string> ModelGroup::collect() {
  std::vector<std::string> out;
  std::string error;
  for (size_t i = 0; i < control_.size(); ++i) {
    try {
      Wire w(control_[i].recv_frame());
      const std::string e = w.str();
      if (!e.empty() && error.empty()) error = fmt::format("node {}: {}", i + 1, e);
      out.push_back(w.str());
    } catch (const Error& e) {
      if (error.empty()) error = fmt::format("node {}: {}", i + 1, e.what());
      out.emplace_back();
    }
  }
  if (!error.empty()) fail("{}", error);
  return out;
}

std::optional<std::string> ModelGroup::next_command() {
  ATOM_CHECK(is_worker(), "only a worker node takes commands");
  std::string c;
  try {
    c = control_.at(0).recv_frame();
  } catch (const Error& e) {
    log_warn("node {}: the head node is gone ({}); stopping", nodes_->rank(), e.what());
    return std::nullopt;
  }
  if (c.empty()) return std::nullopt;
  return c;
}

void ModelGroup::reply(const std::string& payload, const std::string& error) {
  Wire w;
  w.put_str(error);
  w.put_str(payload);
  control_.at(0).send_frame(w.buffer());
}

StageLink* ModelGroup::link_in(int rank) {
  return rank < tp_ ? nullptr : links_.at(static_cast<size_t>(rank - tp_)).get();
}

StageLink* ModelGroup::link_out(int rank) {
  return rank >= leader() ? nullptr : links_.at(static_cast<size_t>(rank)).get();
}

std::string model_group_shard_command(const std::string& name) {
  Wire w;
  w.put_str("shard");
  w.put_str(name);
  return w.buffer();
}

std::string model_group_shard_reply(ModelGroup& g, Wire& command) {
  const std::string name = command.str();
  Wire w;
  for (int r = 0; r < g.world_size(); ++r) {
    if (!g.holds(r)) continue;
    if (Parameter* p = g.model(r).params().find(name)) {
      w.put_i64(r);
      wire_put_tensor(w, p->data());
    }
  }
  return w.buffer();
}

std::unique_ptr<ModelGroup> model_group_load(const std::string& model_dir,
                                             const ModelOptions& options, int tp_size,
                                             LoadFormat format, Nodes* nodes) {
  if (tp_size < 1) fail("--tensor-parallel-size must be at least 1, got {}", tp_size);
  const int pp = options.pp_size;
  if (pp < 1) fail("--pipeline-parallel-size must be at least 1, got {}", pp);
  std::unique_ptr<ModelGroup> g(new ModelGroup);
  g->tp_ = tp_size;
  g->pp_ = pp;
  const int world = tp_size * pp;
  const int nnodes = nodes ? nodes->size() : 1;
  if (nnodes > 1) {
    if (world % nnodes != 0)
      fail("--tensor-parallel-size {} x --pipeline-parallel-size {} = {} ranks do not split "
           "evenly over --nnodes {}",
           tp_size, pp, world, nnodes);
    if (!options.device.is_cpu())
      fail("--nnodes {}: ranks on several nodes run on CPU ranks only so far ({} asked for; "
           "NCCL's bootstrap over --master-addr is not written yet)",
           nnodes, options.device.str());
    nodes->check_same(
        "model and parallel flags",
        fmt::format("{} tp {} pp {} ep {} redundant {} dp attention {} of {}", model_dir, tp_size,
                    pp, options.expert_parallel, options.num_redundant_experts,
                    options.data_parallel_attention, options.attention_tp_size));
    g->nodes_ = nodes;
  }
  if (world == 1) {
    LoadedModel m = model_load(model_dir, options, format);
    g->models_.push_back(std::move(m.model));
    g->report_ = std::move(m.report);
    g->recurrent_ = !g->models_[0]->state_specs().empty();
    return g;
  }
  const Device first = options.device;
  const bool share = options.ranks_share_device && first.is_cuda();
  // Pipeline stages on CUDA (eager stages, the memory profile through them, links through the
  // host): verified by GpuPp.TwoStagesOnOneGpuMatchOneRank (both stages on one H100, 2026-12-07).
  // Data-parallel attention's CUDA path (a second, local step uploaded per rank, eager steps) is
  // not verified on GPUs (several are needed: NCCL runs one rank of a communicator per device).
  const int A = options.attention_tp_size;
  if (options.data_parallel_attention) {
    if (A < 1 || tp_size % A != 0)
      fail("data-parallel attention: {} ranks do not split into groups of --tensor-parallel-size "
           "{}",
           tp_size, A);
    if (first.is_cuda())
      fail("--data-parallel-size {}: data-parallel attention runs on CPU ranks only so far (its "
           "CUDA path is not verified on GPUs yet)",
           tp_size / A);
    if (pp > 1)
      fail("--data-parallel-size {} with --pipeline-parallel-size {}: data-parallel attention "
           "within pipeline stages is not supported yet",
           tp_size / A, pp);
    if (A > 1 && nnodes > 1)
      fail("--data-parallel-size {} with --tensor-parallel-size {} over --nnodes {}: "
           "data-parallel attention groups of several ranks run on one node so far",
           tp_size / A, A, nnodes);
  }
  if (share && tp_size > 1)
    fail("ranks_share_device: a tensor-parallel group of {} ranks cannot share {} (NCCL runs one "
         "rank of a communicator per device)",
         tp_size, first.str());
  std::vector<Device> devices;
  for (int r = 0; r < world; ++r)
    devices.push_back(first.is_cpu() || share ? first : Device::cuda(first.index + r));
  if (first.is_cuda() && !share) {
    const int visible = cuda_device_count();
    if (first.index + world > visible)
      fail("--tensor-parallel-size {}{} needs {} GPUs ({} to {}), but {} {} visible", tp_size,
           pp > 1 ? fmt::format(" x --pipeline-parallel-size {}", pp) : std::string(), world,
           devices.front().str(), devices.back().str(), visible, visible == 1 ? "is" : "are");
  }
  // The node of each rank (all 0 on one node), and this process's ranks.
  const int me = nnodes > 1 ? nodes->rank() : 0;
  std::vector<int> node_of(static_cast<size_t>(world), 0);
  std::vector<int> local;
  std::vector<Device> local_devices;
  for (int r = 0; r < world; ++r) {
    if (nnodes > 1) node_of[static_cast<size_t>(r)] = node_of_rank(r, world, nnodes, g->leader());
    if (node_of[static_cast<size_t>(r)] != me) continue;
    local.push_back(r);
    local_devices.push_back(devices[static_cast<size_t>(r)]);
  }
  for (int s = 0; s < pp; ++s) {
    std::vector<int> stage_nodes(node_of.begin() + s * tp_size,
                                 node_of.begin() + (s + 1) * tp_size);
    const bool mine = std::count(stage_nodes.begin(), stage_nodes.end(), me) > 0;
    const bool spread = std::count(stage_nodes.begin(), stage_nodes.end(), stage_nodes[0]) !=
                        static_cast<int64_t>(tp_size);
    if (!mine)
      g->comms_.push_back(nullptr);
    else if (spread)
      g->comms_.push_back(comm_group_create(*nodes, fmt::format("stage{}", s),
                                            devices[static_cast<size_t>(s * tp_size)],
                                            stage_nodes));
    else
      g->comms_.push_back(comm_group_create(devices[static_cast<size_t>(s * tp_size)], tp_size));
  }
  if (options.data_parallel_attention && A > 1 && tp_size > A)
    for (int d = 0; d < tp_size / A; ++d)
      g->attention_comms_.push_back(comm_group_create(devices[static_cast<size_t>(d * A)], A));
  for (int r = 0; r < (pp - 1) * tp_size; ++r) {
    const int from = node_of[static_cast<size_t>(r)];
    const int to = node_of[static_cast<size_t>(r + tp_size)];
    auto link = std::make_unique<StageLink>();
    const std::string channel = fmt::format("link{}", r);
    if (from == me && to != me) link->to_socket(nodes->connect(channel, to));
    if (to == me && from != me) link->from_socket(nodes->connect(channel, from));
    g->links_.push_back(std::move(link));
  }
  if (nnodes > 1) {
    if (me == 0)
      for (int n = 1; n < nnodes; ++n) g->control_.push_back(nodes->connect("control", n));
    else
      g->control_.push_back(nodes->connect("control", 0));
  }
  g->threads_ = std::make_unique<RankThreads>(local_devices, local);
  if (nnodes > 1)
    g->threads_->set_agree_hook(
        [nodes](int v) { return static_cast<int>(nodes->min_over_nodes("agree", v)); });
  g->threads_->set_failure_hook([gp = g.get()] {
    for (auto& c : gp->comms_)
      if (c) c->abort();
    for (auto& c : gp->attention_comms_)
      if (c) c->abort();
    for (auto& l : gp->links_) l->abort();
  });
  g->models_.resize(static_cast<size_t>(world));
  const int report_rank = local.front();
  g->threads_->run([&](int r) {
    const int stage = r / tp_size, t = r % tp_size;
    ModelOptions o = options;
    o.device = devices[static_cast<size_t>(r)];
    o.tp_rank = t;
    o.tp_size = tp_size;
    o.comm = &g->comms_[static_cast<size_t>(stage)]->communicator(t);
    if (!g->attention_comms_.empty())
      o.attention_comm = &g->attention_comms_[static_cast<size_t>(t / A)]->communicator(t % A);
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
    if (r == report_rank) g->report_ = std::move(m.report);
  });
  // Whether any rank keeps recurrent state, agreed now: later only the head asks.
  bool any = false;
  for (const auto& m : g->models_)
    if (m && !m->state_specs().empty()) any = true;
  g->recurrent_ = g->max_over_nodes("recurrent", any ? 1 : 0) != 0;
  return g;
}

}  // namespace atom
