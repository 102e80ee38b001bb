#include "models/model.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "layers/moe.h"

namespace atom {

namespace {
DType default_act_dtype(const ModelConfig& c, const ModelOptions& o) {
  if (o.act_dtype) return *o.act_dtype;
  if (o.device.is_cpu()) return DType::kF32;
  return c.dtype == DType::kF16 ? DType::kF16 : DType::kBF16;
}

DType default_weight_dtype(const ModelConfig& c, const ModelOptions& o, DType act) {
  if (o.weight_dtype) return *o.weight_dtype;
  if (o.device.is_cpu() &&
      (c.dtype == DType::kF32 || c.dtype == DType::kBF16 || c.dtype == DType::kF16))
    return c.dtype;
  return act;
}

struct Registered {
  ModelFactory factory;
  ModelSupport support;
};

std::map<std::string, Registered>& registry() {
  static std::map<std::string, Registered> r;
  return r;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}
}  // namespace

void model_config_check_support(const ModelConfig& c, const ModelSupport& s,
                                const std::string& arch) {
  const ConfigFields& t = c.text;
  if (!contains(s.activations, c.hidden_act))
    t.bad("hidden_act", fmt::format("is '{}', which {} does not implement (it implements: {})",
                                    c.hidden_act, arch, join(s.activations)));
  const char* rope_field = t.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  auto check_rope = [&](const RopeConfig& r, const std::string& where) {
    if (!contains(s.rope_types, r.type))
      t.bad(where, fmt::format("asks for rope type '{}', which {} does not implement (it "
                               "implements: {})",
                               r.type, arch, join(s.rope_types)));
  };
  if (s.head_dim && c.head_dim < 1)
    t.bad("head_dim", fmt::format("must be positive for {}, got {}", arch, c.head_dim));
  check_rope(c.rope, rope_field);
  for (const auto& [layer_type, r] : c.rope_by_layer_type)
    check_rope(r, std::string(rope_field) + "." + layer_type);
  for (size_t i = 0; i < c.layer_types.size(); ++i)
    if (!contains(s.layer_types, c.layer_types[i]))
      t.bad("layer_types", fmt::format("entry {} is '{}', a layer type {} does not implement (it "
                                       "implements: {})",
                                       i, c.layer_types[i], arch, join(s.layer_types)));
}

Model::Model(const ModelConfig& config, const ModelOptions& options)
    : config_(config),
      ctx_{params_, options.device,
           default_weight_dtype(config, options, default_act_dtype(config, options)),
           default_act_dtype(config, options), options.tp_rank, options.tp_size,
           options.comm ? options.comm : &solo_, &cache_specs_, &state_specs_,
           // Never under expert parallelism: a fused shared slot would be whole on every rank.
           options.fuse_shared_experts.value_or(moe_fuse_shared_experts_from_env()) &&
               !(options.expert_parallel && options.tp_size > 1),
           config_.quantization ? &*config_.quantization : nullptr, default_packed_modules(),
           options.fp8_resident.value_or(!options.device.is_cpu()), options.expert_parallel,
           options.num_redundant_experts, &eplb_layers_} {
  eplb_step_interval_ = options.eplb_step_interval;
  ctx_.stage = pipeline_stage(config.num_hidden_layers, options.pp_rank, options.pp_size,
                              options.pp_layer_partition);
  if (options.tp_size < 1 || options.tp_rank < 0 || options.tp_rank >= options.tp_size)
    fail("tensor-parallel rank {} of size {} is invalid", options.tp_rank, options.tp_size);
  if (options.tp_size > 1 && (!options.comm || options.comm->size() != options.tp_size))
    fail("tensor-parallel size {} needs a communicator of that size", options.tp_size);
  const int A = options.attention_tp_size;
  if (options.data_parallel_attention && options.tp_size > A) {
    if (A < 1 || options.tp_size % A != 0)
      fail("data-parallel attention: {} ranks do not split into groups of {}", options.tp_size, A);
    if (A > 1 && (!options.attention_comm || options.attention_comm->size() != A))
      fail("data-parallel attention groups of {} ranks need a communicator of that size", A);
    attention_ctx_ = std::make_unique<LayerContext>(ctx_);
    attention_ctx_->tp_rank = options.tp_rank % A;
    attention_ctx_->tp_size = A;
    attention_ctx_->comm = A > 1 ? options.attention_comm : &solo_;
    ctx_.data_parallel_attention = attention_ctx_.get();
  }
}

int Model::rebalance_experts() {
  int changed = 0;
  double before = 0, after = 0;
  for (FusedMoE* m : eplb_layers_) {
    std::pair<double, double> b{1.0, 1.0};
    changed += m->rebalance(*ctx_.comm, &b) ? 1 : 0;
    before += b.first;
    after += b.second;
  }
  if (ctx_.tp_rank == 0 && !eplb_layers_.empty()) {
    const double n = static_cast<double>(eplb_layers_.size());
    log_info("EPLB: re-placed the experts of {} of {} layers; balancedness (mean / max rank load, "
             "layer average) {:.3f} -> {:.3f}",
             changed, eplb_layers_.size(), before / n, after / n);
  }
  return changed;
}

std::vector<PackedModule> default_packed_modules() {
  return {{"q_proj", "qkv_proj", "q"},
          {"k_proj", "qkv_proj", "k"},
          {"v_proj", "qkv_proj", "v"},
          {"gate_proj", "gate_up_proj", "0"},
          {"up_proj", "gate_up_proj", "1"}};
}

WeightLoadSpec Model::weight_load_spec() const {
  WeightLoadSpec s;
  s.num_hidden_layers = config_.num_hidden_layers;
  s.packed_modules = default_packed_modules();
  const bool tied = config_.tie_word_embeddings;
  s.ignorable = [tied](const std::string& name) {
    if (name.ends_with("rotary_emb.inv_freq")) return true;
    return tied && name == "lm_head.weight";
  };
  return s;
}

void model_registry_add(const std::string& architecture, ModelFactory factory,
                        ModelSupport support) {
  if (registry().count(architecture))
    fail("model architecture '{}' is registered twice (two model files claim it)", architecture);
  registry()[architecture] = {std::move(factory), std::move(support)};
}

const ModelSupport& model_support(const std::string& architecture) {
  auto it = registry().find(architecture);
  if (it == registry().end()) fail("architecture '{}' is not registered", architecture);
  return it->second.support;
}

std::vector<std::string> model_registry_list() {
  std::vector<std::string> r;
  for (const auto& [k, v] : registry()) r.push_back(k);
  return r;
}

std::unique_ptr<Model> model_create(const ModelConfig& config, const ModelOptions& options) {
  const std::string& arch = config.architectures.at(0);
  auto it = registry().find(arch);
  if (it == registry().end()) {
    std::string list;
    for (const auto& a : model_registry_list()) list += (list.empty() ? "" : ", ") + a;
    fail("{}: architecture '{}' is not supported; supported architectures: {}", config.path, arch,
         list);
  }
  model_config_check_support(config, it->second.support, arch);
  std::unique_ptr<Model> model = it->second.factory(config, options);
  if (config.quantization) {
    const auto methods = model->quantization_methods();
    if (std::find(methods.begin(), methods.end(), config.quantization->method) == methods.end()) {
      std::string list;
      for (const auto& m : methods) list += (list.empty() ? "" : ", ") + m;
      fail("{}: quantization_config.quant_method '{}' is not supported for {}{}", config.path,
           config.quantization->method, arch,
           list.empty() ? std::string(" (it reads unquantised weights only)")
                        : " (it reads: " + list + ")");
    }
  }
  return model;
}

void keep_layer_output(Step& step, int64_t layer, const Tensor& x) {
  if (!step.layer_outputs || !step.layer_outputs_out) return;
  const std::vector<int64_t>& want = *step.layer_outputs;
  const auto it = std::find(want.begin(), want.end(), layer);
  if (it == want.end()) return;
  ATOM_CHECK(x.device().is_cpu() && x.dtype() == DType::kF32 && x.is_contiguous() &&
                 (x.dim() == 2 || x.dim() == 3),
             "keep_layer_output: layer {}'s output {} is not [T, (hc,) hidden] F32 on the CPU",
             layer, x.str());
  const int64_t T = x.size(0), D = x.size(x.dim() - 1), hc = x.dim() == 3 ? x.size(1) : 1;
  const int64_t n = static_cast<int64_t>(want.size()), j = it - want.begin();
  Tensor& out = *step.layer_outputs_out;
  if (!out.defined()) {
    out = step.empty({T, n * D}, DType::kF32);
    std::fill_n(out.ptr<float>(), out.numel(), 0.0f);
  }
  ATOM_CHECK(out.size(0) == T && out.size(1) == n * D,
             "keep_layer_output: layer {} gives [{}, {}] rows into {}", layer, T, D, out.str());
  const float* src = x.ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    float* dst = out.ptr<float>() + t * n * D + j * D;
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0;
      for (int64_t k = 0; k < hc; ++k) acc += src[(t * hc + k) * D + d];
      dst[d] = acc / static_cast<float>(hc);
    }
  }
}

}  // namespace atom
