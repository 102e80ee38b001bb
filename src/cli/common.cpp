#include "cli/common.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "engine/tp_runner.h"

namespace atom::cli {

void model_args_add(CLI::App* cmd, ModelArgs& a) {
  cmd->add_option("--model", a.model, "Hugging Face model folder (config.json + safetensors)")
      ->required();
  model_args_add_placement(cmd, a);
}

void model_args_add_placement(CLI::App* cmd, ModelArgs& a) {
  cmd->add_option("--device", a.device, "cpu or cuda (default: cuda when a GPU is present)");
  cmd->add_option("--load-format", a.load_format,
                  "auto | safetensors | dummy (seeded random weights from config.json alone)");
  // vLLM's short spelling, -tp, is not a name CLI11 accepts (one-character short names only).
  cmd->add_option("--tensor-parallel-size,--tp", a.tensor_parallel_size,
                  "ranks to split the model over: GPUs cuda:0, cuda:1, ... (threads on the CPU)")
      ->capture_default_str();
  cmd->add_option("--pipeline-parallel-size,--pp", a.pipeline_parallel_size,
                  "pipeline stages, each of --tensor-parallel-size ranks holding consecutive "
                  "layers (vLLM's partition; a GPU per rank on CUDA)")
      ->capture_default_str();
  cmd->add_option("--data-parallel-size,--dp", a.data_parallel_size,
                  "data-parallel attention (latent-attention models): D groups of "
                  "--tensor-parallel-size ranks, each group attending for its own sequences with "
                  "its heads split over its ranks and holding only their KV; the other layers are "
                  "split over all the ranks (experts with --enable-expert-parallel); CPU ranks "
                  "only so far")
      ->capture_default_str();
  // vLLM's -ep is rewritten to this name before parsing (main.cpp), as -tp is.
  cmd->add_flag("--enable-expert-parallel", a.enable_expert_parallel,
                "mixtures of experts: each of the --tensor-parallel-size ranks holds whole routed "
                "experts, 1/N of them, and reads only their weights (attention stays "
                "tensor-parallel)");
  cmd->add_flag("--enable-eplb", a.enable_eplb,
                "expert parallelism load balancing: redundant copies of experts over the ranks "
                "(--eplb-config's num_redundant_experts)");
  cmd->add_option("--eplb-config", a.eplb_config,
                  "vLLM's JSON, e.g. '{\"num_redundant_experts\": 32, \"step_interval\": 3000}' "
                  "(the load since the last re-placement decides the next; window_size and "
                  "log_balancedness are accepted)");
  cmd->add_option("--num-redundant-experts", a.num_redundant_experts,
                  "redundant experts with --enable-eplb (older vLLM spelling)");
  cmd->add_option("--nnodes", a.nnodes,
                  "hosts the --tensor-parallel-size x --pipeline-parallel-size ranks split over "
                  "(one process each, started with the same flags; CPU ranks so far)")
      ->capture_default_str();
  cmd->add_option("--node-rank", a.node_rank,
                  "this host's place among --nnodes: 0 serves and drives the others")
      ->capture_default_str();
  cmd->add_option("--master-addr", a.master_addr, "address of node 0, where the others join")
      ->capture_default_str();
  cmd->add_option("--master-port", a.master_port, "port of node 0's rendezvous store")
      ->capture_default_str();
  cmd->add_flag("--headless", a.headless,
                "a worker node: serves no requests, runs the head's steps on its ranks");
  cmd->add_option("--dtype", a.dtype,
                  "activation dtype: auto (bf16 on CUDA, f32 on the CPU), bfloat16, float16, "
                  "float32")
      ->capture_default_str()
      ->check([](const std::string& v) {  // refused before the model loads
        try {
          dtype_arg_parse(v);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      });
}

EplbArgs eplb_args_parse(const ModelArgs& a) {
  EplbArgs r;
  int n = 0;
  if (!a.eplb_config.empty()) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(a.eplb_config);
    } catch (const std::exception& e) {
      fail("--eplb-config is not JSON: {}", e.what());
    }
    if (!j.is_object()) fail("--eplb-config must be a JSON object, got {}", a.eplb_config);
    for (const auto& [k, v] : j.items()) {
      if (k == "num_redundant_experts") {
        if (!v.is_number_integer()) fail("--eplb-config: num_redundant_experts must be an integer");
        n = v.get<int>();
      } else if (k == "step_interval") {
        if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 30))
          fail("--eplb-config: step_interval must be an integer in [1, 2^30]");
        r.step_interval = v.get<int>();
      } else if (k != "window_size" && k != "log_balancedness" && k != "use_async" &&
                 k != "policy") {
        fail("--eplb-config: unknown key '{}' (known: num_redundant_experts, window_size, "
             "step_interval, log_balancedness, use_async, policy)",
             k);
      }
    }
  }
  if (a.num_redundant_experts >= 0) n = a.num_redundant_experts;
  if (n < 0) fail("--eplb-config: num_redundant_experts must be at least 0, got {}", n);
  if (!a.enable_eplb) {
    if (n > 0) fail("redundant experts ({}) need --enable-eplb", n);
    return r;
  }
  if (!a.enable_expert_parallel)
    fail("--enable-eplb needs --enable-expert-parallel (and --tensor-parallel-size > 1)");
  r.num_redundant_experts = n;
  return r;
}

std::optional<DType> dtype_arg_parse(const std::string& s) {
  if (s == "auto") return std::nullopt;
  if (s == "bfloat16" || s == "bf16") return DType::kBF16;
  if (s == "float16" || s == "half" || s == "fp16") return DType::kF16;
  if (s == "float32" || s == "float" || s == "fp32") return DType::kF32;
  fail("--dtype '{}' is not one of: auto, bfloat16, float16 (half), float32 (float)", s);
}

std::vector<int> pp_layer_partition_parse(const std::string& s) {
  std::vector<int> counts;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    const std::string item = s.substr(at, comma - at);
    int v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 1)
      fail("VLLM_PP_LAYER_PARTITION '{}': '{}' is not a positive layer count (expected e.g. "
           "\"4,6,6,4\")",
           s, item);
    counts.push_back(v);
    at = comma + 1;
  }
  return counts;
}

namespace {
// " in each of N pipeline stages (layers [0, 16) [16, 31) ...)".
std::string stage_layers(ModelGroup& m) {
  std::string layers;
  for (int s = 0; s < m.pp_size(); ++s) {
    if (!m.holds(s * m.tp_size())) {
      layers += fmt::format("{}(another node)", s ? " " : "");
      continue;
    }
    const PipelineStage& st = m.model(s * m.tp_size()).stage();
    layers += fmt::format("{}[{}, {})", s ? " " : "", st.first_layer, st.end_layer);
  }
  return fmt::format(" in each of {} pipeline stages (layers {})", m.pp_size(), layers);
}
}  // namespace

std::optional<NodeOptions> node_options(const ModelArgs& a,
                                        const std::function<const char*(const char*)>& env) {
  const ModelArgs defaults;
  NodeOptions no;
  no.nnodes = a.nnodes;
  no.node_rank = a.node_rank;
  no.master_addr = a.master_addr;
  no.master_port = a.master_port;
  if (a.nnodes != 1 || a.node_rank != 0 || a.headless) {
    if (a.headless && a.node_rank == 0)
      fail("--headless is a worker's flag: give it a --node-rank from 1 to --nnodes - 1");
    return no;
  }
  // An MPI launcher's processes: one node each.
  auto number = [&](const char* k, int lo, int hi) -> std::optional<int> {
    const char* v = env(k);
    if (!v || !*v) return std::nullopt;
    int x = 0;
    const char* end = v + std::strlen(v);
    const auto [p, ec] = std::from_chars(v, end, x);
    if (ec != std::errc() || p != end || x < lo || x > hi)
      fail("{}='{}': not a whole number from {} to {}", k, v, lo, hi);
    return x;
  };
  const char* size_var = env("OMPI_COMM_WORLD_SIZE") ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE";
  const std::optional<int> size = number(size_var, 1, 1 << 16);
  if (!size || *size == 1) return std::nullopt;
  const bool ompi = size_var[0] == 'O';
  const std::optional<int> rank = number(ompi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK", 0, *size - 1);
  if (!rank) fail("{}={} without {}", size_var, *size, ompi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK");
  const std::optional<int> local =
      number(ompi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "MPI_LOCALNRANKS", 1, 1 << 16);
  no.nnodes = *size;
  no.node_rank = *rank;
  if (a.master_addr == defaults.master_addr) {
    if (const char* m = env("MASTER_ADDR"); m && *m)
      no.master_addr = m;
    else if (!local || *local < *size)
      fail("{} processes under an MPI launcher over several hosts: give node 0's address with "
           "--master-addr or MASTER_ADDR",
           *size);
  }
  if (a.master_port == defaults.master_port)
    if (const std::optional<int> port = number("MASTER_PORT", 1, 65535)) no.master_port = *port;
  return no;
}

std::unique_ptr<ModelGroup> model_args_load(const ModelArgs& a) {
  ModelOptions o;
  o.device = a.device.empty() ? device_default() : device_parse(a.device);
  o.act_dtype = dtype_arg_parse(a.dtype);
  o.expert_parallel = a.enable_expert_parallel;
  o.pp_size = a.pipeline_parallel_size;
  int ranks = a.tensor_parallel_size;
  if (a.data_parallel_size < 1)
    fail("--data-parallel-size must be at least 1, got {}", a.data_parallel_size);
  if (a.data_parallel_size > 1) {
    // vLLM's -dp D -tp T: D groups of T ranks, each group's attention tensor-parallel over its
    // ranks; the other layers over all D x T.
    o.data_parallel_attention = true;
    o.attention_tp_size = a.tensor_parallel_size;
    ranks = a.data_parallel_size * a.tensor_parallel_size;
  }
  if (const char* p = std::getenv("VLLM_PP_LAYER_PARTITION"); p && *p && o.pp_size > 1)
    o.pp_layer_partition = pp_layer_partition_parse(p);
  const EplbArgs eplb = eplb_args_parse(a);
  o.num_redundant_experts = eplb.num_redundant_experts;
  o.eplb_step_interval = eplb.step_interval;
  if (o.device.is_cuda() && !cuda_available())
    fail("--device {}: no usable NVIDIA GPU found (or this build has no CUDA backend)",
         o.device.str());
  std::unique_ptr<Nodes> nodes;
  if (const std::optional<NodeOptions> no =
          node_options(a, [](const char* k) { return std::getenv(k); }))
    nodes = std::make_unique<Nodes>(*no);
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<ModelGroup> m =
      model_group_load(a.model, o, ranks, load_format_parse(a.load_format), nodes.get());
  if (nodes) m->own_nodes(std::move(nodes));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const LoadReport& report = m->report();
  const auto& st = report.checkpoint;
  const std::string where =
      m->world_size() == 1
          ? o.device.str()
          : fmt::format("{} {}-parallel ranks from {}{}", m->tp_size(),
                        o.data_parallel_attention
                            ? (o.expert_parallel ? "data-parallel attention, expert"
                                                 : "data-parallel attention, tensor")
                        : o.expert_parallel ? "tensor- and expert"
                                            : "tensor",
                        o.device.str(), m->pp_size() == 1 ? std::string() : stage_layers(*m));
  const std::string others =
      report.tensors_other_ranks == 0
          ? std::string()
          : fmt::format(", {} expert tensors ({:.1f} MB) of other ranks left unread",
                        report.tensors_other_ranks,
                        static_cast<double>(report.bytes_other_ranks) / 1e6);
  log_info("loaded {} ({}) on {} in {:.2f} s: {} tensors, {} of {} shards read, {:.1f} MB read{}{}",
           a.model, m->model().config().architectures[0], where, s, report.tensors_loaded,
           st.shards_read, st.shards_total, static_cast<double>(st.bytes_read) / 1e6, others,
           m->world_size() == 1 ? "" : " (rank 0)");
  return m;
}

bool worker_ran(ModelGroup& m) {
  if (!m.is_worker()) return false;
  log_info("node {}: running the head node's steps on ranks of this node", m.nodes()->rank());
  tp_runner_follow(m);
  log_info("node {}: the head node is done", m.nodes()->rank());
  return true;
}

std::unique_ptr<LoadedDrafter> model_args_load_drafter(const ModelArgs& a, ModelGroup& m,
                                                       const EngineConfig& c) {
  if (c.speculative_method.empty()) return nullptr;
  // Under tensor parallelism the drafter is whole, on the leader's device.
  ModelOptions o;
  o.device = m.model(m.leader()).device();
  o.act_dtype = dtype_arg_parse(a.dtype);
  return std::make_unique<LoadedDrafter>(
      drafter_load(a.model, m, o, load_format_parse(a.load_format)));
}

std::vector<int32_t> token_list_parse(const std::string& s, const std::string& flag) {
  std::vector<int32_t> r;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = s.find(',', pos);
    const std::string item =
        s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX)
      fail("{} '{}': expected comma-separated non-negative token ids", flag, s);
    r.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return r;
}

}  // namespace atom::cli
