// Options shared by the commands that load a model.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/nodes.h"
#include "engine/engine_config.h"
#include "models/draft_model.h"
#include "models/loading.h"
#include "models/model_group.h"

namespace atom::cli {

struct ModelArgs {
  std::string model;
  std::string device;  // empty: cuda when a GPU is present, else cpu
  std::string load_format = "auto";
  int tensor_parallel_size = 1;  // ranks: GPUs cuda:0.. (counted from --device), or CPU threads
  // --pipeline-parallel-size (also -pp): stages of tensor_parallel_size ranks each, holding
  // consecutive layers (ModelOptions::pp_size).
  int pipeline_parallel_size = 1;
  // --data-parallel-size (also -dp): that many groups of --tensor-parallel-size ranks split the
  // sequences for attention (ModelOptions::data_parallel_attention), each group's heads split
  // over its ranks, and the rest of the model (experts with --enable-expert-parallel) over all
  // the ranks.
  int data_parallel_size = 1;
  std::string dtype = "auto";  // --dtype: the activations' dtype
  // --enable-expert-parallel (also -ep): the ranks split the routed experts instead of slicing
  // each one (ModelOptions::expert_parallel).
  bool enable_expert_parallel = false;
  // vLLM's EPLB flags: --enable-eplb with --eplb-config '{"num_redundant_experts": N, ...}' (or
  // the older --num-redundant-experts N): N redundant expert copies over the expert-parallel ranks.
  bool enable_eplb = false;
  std::string eplb_config;
  int num_redundant_experts = -1;  // -1: from --eplb-config (default 0)
  // Several hosts (vLLM's flags): the tp x pp ranks split over --nnodes processes, node 0 (the
  // head) serving and driving the others, which find it at --master-addr:--master-port
  // (dist/nodes.h). --headless marks a worker (any --node-rank > 0 is one).
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool headless = false;
};

// Where this process sits among several nodes: vLLM's --nnodes / --node-rank / --master-addr /
// --master-port, or, without them, an MPI launcher's environment, one node per process as
// TensorRT-LLM is launched (`mpirun -np N atom serve ...`: Open MPI's OMPI_COMM_WORLD_SIZE,
// _RANK and _LOCAL_SIZE; MPICH's and Slurm's PMI_SIZE, PMI_RANK and MPI_LOCALNRANKS). Node 0's
// address: --master-addr, else MASTER_ADDR, else 127.0.0.1 when every process runs on this host
// (several hosts without an address are an error saying so); the port: --master-port, else
// MASTER_PORT. nullopt: one node. `env` reads a variable (std::getenv).
std::optional<NodeOptions> node_options(const ModelArgs& a,
                                        const std::function<const char*(const char*)>& env);

// What the EPLB flags ask for: the redundant experts (0 without --enable-eplb) and the steps
// between re-placements (--eplb-config's step_interval, vLLM's default 3000); an error naming the
// flag for a malformed --eplb-config, a negative value, or EPLB without --enable-expert-parallel.
struct EplbArgs {
  int num_redundant_experts = 0;
  int step_interval = 3000;
};
EplbArgs eplb_args_parse(const ModelArgs& a);

// vLLM's --dtype: auto (the device's default), bfloat16 / bf16, float16 / half / fp16,
// float32 / float; nullopt for auto, an error naming the value otherwise.
std::optional<DType> dtype_arg_parse(const std::string& s);

// --model and the options of model_args_add_placement.
void model_args_add(CLI::App* cmd, ModelArgs& a);
// --device, --load-format, --tensor-parallel-size (also --tp) and --enable-expert-parallel, for
// commands that take the model otherwise (atom serve MODEL).
void model_args_add_placement(CLI::App* cmd, ModelArgs& a);
// Loads every tensor-parallel rank of the model, logging the time it took.
// VLLM_PP_LAYER_PARTITION's comma-separated layer counts ("4,6,6,4"); anything else is an error
// naming the variable.
std::vector<int> pp_layer_partition_parse(const std::string& s);
std::unique_ptr<ModelGroup> model_args_load(const ModelArgs& a);

// On a worker node of a run over several nodes: takes the head's commands until the head is done
// and returns true (the command then ends); false on the head or with one node.
bool worker_ran(ModelGroup& m);

// The target's MTP drafter when the engine config asks for speculative decoding (from the same
// checkpoint, with the same placement), else null.
std::unique_ptr<LoadedDrafter> model_args_load_drafter(const ModelArgs& a, ModelGroup& m,
                                                       const EngineConfig& c);
// The drafter model itself, or null.
inline DraftModel* drafter_of(const std::unique_ptr<LoadedDrafter>& d) {
  return d ? d->model.get() : nullptr;
}

// "1,2,3" -> {1, 2, 3}; an error naming `flag` on anything else.
std::vector<int32_t> token_list_parse(const std::string& s, const std::string& flag);

}  // namespace atom::cli
