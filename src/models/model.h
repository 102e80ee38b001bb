// The model interface every architecture implements, the options it is built with, and the
// registry from a checkpoint's `architectures` string to a factory.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "layers/context.h"
#include "loader/hf_config.h"
#include "loader/weight_loading.h"

namespace atom {

class VisionEncoder;  // models/moonvit.h

struct ModelOptions {
  Device device = Device::cpu();
  // Activation dtype. Default: F32 on the CPU reference backend, BF16 (F16 for F16 checkpoints)
  // on CUDA.
  std::optional<DType> act_dtype;
  // Weight storage dtype. Default: the checkpoint's dtype on the CPU, the activation dtype on CUDA.
  std::optional<DType> weight_dtype;
  int tp_rank = 0;
  int tp_size = 1;
  Communicator* comm = nullptr;  // required when tp_size > 1
  // Pipeline parallelism: this model is stage pp_rank of pp_size (LayerContext::stage), holding
  // only its layers (and the embedding on the first stage, the final norm and head on the last).
  int pp_rank = 0;
  int pp_size = 1;
  // The layers of each stage (vLLM's VLLM_PP_LAYER_PARTITION); empty: vLLM's even split.
  std::vector<int> pp_layer_partition;
  // model_group_load on CUDA: every rank on `device` instead of one GPU each (tests of the
  // pipeline on a machine with one GPU; a tensor-parallel group of several ranks on one GPU is
  // refused, NCCL does not run two ranks of a communicator on one device).
  bool ranks_share_device = false;
  // Mixtures of experts: load shared experts as slots of the fused experts layer instead of a
  // separate MLP (the same values either way). Default: ATOM_MOE_FUSE_SHARED_EXPERTS (off).
  std::optional<bool> fuse_shared_experts;
  // FP8 checkpoint weights stay FP8 on the device (products through kernels::linear_fp8).
  // Default: on CUDA; the CPU reference dequantises them at load.
  std::optional<bool> fp8_resident;
  // Expert parallelism over the tensor-parallel ranks (LayerContext::expert_parallel).
  bool expert_parallel = false;
  // EPLB's redundant experts (LayerContext::num_redundant_experts), and every how many engine
  // steps their placement follows the experts' load (vLLM's step_interval; 0: never).
  int num_redundant_experts = 0;
  int eplb_step_interval = 3000;
  // Data-parallel attention (vLLM's --data-parallel-size): the tp_size ranks split the step's
  // sequences for attention, each holding every head and only its sequences' KV, instead of
  // splitting the heads (LayerContext::data_parallel_attention); the other layers stay tensor-
  // (or expert-) parallel over them. For models with supports_data_parallel_attention().
  bool data_parallel_attention = false;
  // Data-parallel attention over groups of this many consecutive ranks (vLLM's -dp D -tp T: D
  // groups of T): a group attends for its sequences with its heads split tensor-parallel over its
  // ranks (attention_comm, the group's communicator; null when 1).
  int attention_tp_size = 1;
  Communicator* attention_comm = nullptr;
};

// The fused modules every model starts from: q/k/v_proj -> qkv_proj, gate/up_proj ->
// gate_up_proj (Model::weight_load_spec; layers look up their parts' quantisation by them).
std::vector<PackedModule> default_packed_modules();

// The FP8 checkpoint methods (loader/quantization.h) a model whose weights are all linear layers
// (layers/linear.h) and fused experts (layers/moe.h) reads.
inline std::vector<std::string> fp8_quantization_methods() {
  return {"fp8", "compressed-tensors", "fbgemm_fp8"};
}

class Model {
 public:
  Model(const ModelConfig& config, const ModelOptions& options);
  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  ParamRegistry& params() { return params_; }
  const std::vector<CacheSpec>& cache_specs() const { return cache_specs_; }
  // Per-request recurrent state of each recurrent layer (empty for pure attention models).
  const std::vector<StateCacheSpec>& state_specs() const { return state_specs_; }
  Device device() const { return ctx_.device; }
  bool fuse_shared_experts() const { return ctx_.fuse_shared_experts; }
  // EPLB: re-places every layer's redundant experts from the load counted since the last call
  // (FusedMoE::rebalance); every rank calls it at once (collectives). Returns the layers whose
  // placement changed. eplb_step_interval(): how often the engine calls it (0: never, or no
  // layer has redundant experts).
  int rebalance_experts();
  int eplb_step_interval() const { return eplb_layers_.empty() ? 0 : eplb_step_interval_; }
  const std::vector<FusedMoE*>& eplb_layers() const { return eplb_layers_; }
  bool expert_parallel() const { return ctx_.experts_split(); }
  // Whether the ranks split sequences instead of heads for attention (ModelOptions), and whether
  // the model's attention layers can (they are built in attention_context() and run through
  // data_parallel_attention(), layers/dp_attention.h).
  bool data_parallel_attention() const { return ctx_.data_parallel_attention != nullptr; }
  // Data-parallel attention's groups (ModelOptions::attention_tp_size): how many, and this rank's
  // (the block partition whose sequences it attends for). 1 and 0 without it.
  int data_parallel_size() const {
    return data_parallel_attention() ? ctx_.tp_size / ctx_.data_parallel_attention->tp_size : 1;
  }
  int data_parallel_rank() const {
    return data_parallel_attention() ? ctx_.tp_rank / ctx_.data_parallel_attention->tp_size : 0;
  }
  virtual bool supports_data_parallel_attention() const { return false; }
  // The pipeline stage this model is (stage 0 of 1 without pipeline parallelism).
  const PipelineStage& stage() const { return ctx_.stage; }
  // Whether the model builds only its stage's modules and runs from Step::pp_in to Step::pp_out
  // (model_load refuses pp_size > 1 otherwise).
  virtual bool splits_into_stages() const { return false; }
  DType act_dtype() const { return ctx_.act_dtype; }
  int64_t vocab_size() const { return config_.vocab_size; }

  // quantization_config methods this model reads (none by default: full-precision weights).
  virtual std::vector<std::string> quantization_methods() const { return {}; }

  // How checkpoint names reach this model's parameters. The default covers Llama-like models:
  // fused q/k/v and gate/up, and rotary inv_freq buffers that some checkpoints carry.
  virtual WeightLoadSpec weight_load_spec() const;

  // Hidden states after the final norm, [num_tokens, hidden]. A stage before the last writes
  // Step::pp_out instead and returns an undefined tensor.
  virtual Tensor forward(Step& step) = 0;
  // Logits [len(batch.logits_indices), vocab] F32 for the rows the batch asks for.
  virtual Tensor compute_logits(Step& step, const Tensor& hidden) = 0;
  // The vision tower of a model that takes images (its features go in through
  // Batch::input_embeds at the image placeholder tokens); null for text-only models.
  virtual VisionEncoder* vision_encoder() { return nullptr; }
  // Whether forward() hands the outputs of the layers in Step::layer_outputs over
  // (keep_layer_output), for a block drafter (DSpark) that drafts from them.
  virtual bool hands_over_layer_outputs() const { return false; }
  // Whether a decode step can be captured in a CUDA graph: false for a forward pass that works
  // with the host inside the step (DeepSeek-V4.1's Engram hashes on the host and reads its tables
  // there), which then runs eagerly.
  virtual bool runs_in_decode_graphs() const { return true; }

 protected:
  LayerContext& ctx() { return ctx_; }

 private:
  ModelConfig config_;
  ParamRegistry params_;
  std::vector<CacheSpec> cache_specs_;
  std::vector<StateCacheSpec> state_specs_;
  SoloCommunicator solo_;
  std::vector<FusedMoE*> eplb_layers_;
  int eplb_step_interval_ = 0;
  LayerContext ctx_;
  std::unique_ptr<LayerContext> attention_ctx_;  // ctx_.data_parallel_attention
};

// Step::layer_outputs: when the step asks for `layer`'s output, its rows x ([T, hidden], or the
// hyper-connection streams [T, hc, hidden], averaged over the streams) F32 on the CPU go into
// their columns of *Step::layer_outputs_out (allocated on the step's first call).
void keep_layer_output(Step& step, int64_t layer, const Tensor& x);

// The spec's make_layers: layers "<prefix>.0" .. "<prefix>.<n - 1>", layer i built by make(i,
// its prefix) when this pipeline stage owns it (LayerContext::stage), else left null and declared
// a missing module (the spec's PPMissingLayer: its checkpoint tensors are never read).
template <class Layer, class Make>
std::vector<std::unique_ptr<Layer>> make_layers(LayerContext& ctx, int64_t n,
                                                const std::string& prefix, Make make) {
  std::vector<std::unique_ptr<Layer>> layers(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const std::string p = prefix + "." + std::to_string(i);
    if (ctx.stage.owns(i))
      layers[static_cast<size_t>(i)] = make(i, p);
    else
      ctx.params.add_missing_module(p);
  }
  return layers;
}

using ModelFactory =
    std::function<std::unique_ptr<Model>(const ModelConfig& config, const ModelOptions& options)>;

// The values of the config fields that choose a variant which a model implements. model_create
// refuses any other value by name (file and field) before it builds the model, so a checkpoint
// asking for relu², a rope the layers lack or an unknown layer type never runs as something else.
// A model declares its own with ATOM_REGISTER_MODEL_SUPPORTING; quantisation methods are the
// model's quantization_methods().
struct ModelSupport {
  std::vector<std::string> activations{"silu"};  // hidden_act
  // rope_parameters / rope_scaling types: what RotaryEmbedding computes.
  std::vector<std::string> rope_types{"default", "linear", "llama3", "yarn"};
  std::vector<std::string> layer_types{"full_attention"};  // entries of layer_types
  // The model reads head_dim (a config's head_dim of 0 is then refused); false for models whose
  // attention takes its widths from other fields (GLM-5.3, where head_dim is the RoPE width, 0).
  bool head_dim = true;
};

// Refuses a config that asks for what `support` lacks; the error names the file and the field.
void model_config_check_support(const ModelConfig& config, const ModelSupport& support,
                                const std::string& architecture);

// Registers a factory; a second registration of the same architecture is an error.
void model_registry_add(const std::string& architecture, ModelFactory factory,
                        ModelSupport support = {});
// What the registered architecture implements; an error when it is not registered.
const ModelSupport& model_support(const std::string& architecture);
// Registered architecture strings, sorted.
std::vector<std::string> model_registry_list();
// Builds the model for config.architectures[0]; an unknown architecture is an error listing the
// supported ones.
std::unique_ptr<Model> model_create(const ModelConfig& config, const ModelOptions& options);

}  // namespace atom

#define ATOM_MODEL_CONCAT_(a, b) a##b
#define ATOM_MODEL_CONCAT(a, b) ATOM_MODEL_CONCAT_(a, b)
// ATOM_REGISTER_MODEL("LlamaForCausalLM", LlamaForCausalLM);  (the default ModelSupport)
// ATOM_REGISTER_MODEL_SUPPORTING("Qwen3ForCausalLM", Qwen3ForCausalLM, support);
#define ATOM_REGISTER_MODEL_SUPPORTING(arch, Class, support)                   \
  static const bool ATOM_MODEL_CONCAT(atom_model_registered_, __LINE__) = [] { \
    ::atom::model_registry_add(                                                \
        arch,                                                                  \
        [](const ::atom::ModelConfig& c, const ::atom::ModelOptions& o) {      \
          return std::unique_ptr<::atom::Model>(new Class(c, o));              \
        },                                                                     \
        support);                                                              \
    return true;                                                               \
  }()
#define ATOM_REGISTER_MODEL(arch, Class) \
  ATOM_REGISTER_MODEL_SUPPORTING(arch, Class, ::atom::ModelSupport{})
