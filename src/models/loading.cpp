#include "models/loading.h"

#include <cmath>
#include <map>

#include "core/convert.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/random.h"

namespace atom {

LoadFormat load_format_parse(const std::string& s) {
  if (s == "auto") return LoadFormat::kAuto;
  if (s == "safetensors") return LoadFormat::kSafetensors;
  if (s == "dummy") return LoadFormat::kDummy;
  fail("--load-format '{}' is not one of: auto, safetensors, dummy", s);
}

namespace {
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}
}  // namespace

void model_fill_dummy(Model& model, uint64_t seed) {
  // Counter-based values (kernels/random.h) generated where the parameter lives: an 8B model
  // fills in milliseconds on a GPU, and the CPU gives the very same values.
  //
  // FP8 weights (an FP8 checkpoint's layers kept FP8 on the device: "<layer>.weight", and fused
  // experts' "<experts>.w13_weight" / "w2_weight") hold uniform values in ±224 (of e4m3's ±448)
  // and every scale beside them ("weight_scale" after the same prefix) is 1/(224 sqrt(fan_in)),
  // so the dequantised weights have the same spread as the others'; static activation scales are
  // 8/448 (activations of a few units after the norms). The FP8 codes are drawn where the weight
  // lives, as the others.
  auto prefix_of = [](const std::string& name, std::string_view suffix) {
    return name.ends_with(suffix) ? name.substr(0, name.size() - suffix.size()) : std::string();
  };
  std::map<std::string, int64_t> fan_in;  // by prefix: its FP8 weight's columns
  for (const auto& [name, p] : model.params().all())
    if (p->data().dtype() == DType::kF8E4M3 && name.ends_with("weight"))
      fan_in[prefix_of(name, "weight")] = p->data().size(-1);
  for (const auto& [name, p] : model.params().all()) {
    Tensor& d = p->data();
    const std::string scale_of = prefix_of(name, "weight_scale"),
                      input_of = prefix_of(name, ".input_scale");
    if (p->dummy_fill) {
      p->dummy_fill(d, seed ^ fnv1a(name));
    } else if (d.dtype() == DType::kF8E4M3) {
      kernels::fill_uniform(d, seed ^ fnv1a(name), -224.0f, 224.0f);
    } else if (!scale_of.empty() && fan_in.count(scale_of)) {
      const float s =
          static_cast<float>(1.0 / (224.0 * std::sqrt(static_cast<double>(fan_in[scale_of]))));
      kernels::fill_uniform(d, 0, s, s);
    } else if (!input_of.empty() && fan_in.count(input_of + ".")) {
      kernels::fill_uniform(d, 0, 8.0f / 448.0f, 8.0f / 448.0f);
    } else if (name.ends_with("norm.weight") && d.dim() == 1) {
      kernels::fill_uniform(d, 0, 1.0f, 1.0f);
    } else {
      // Uniform in ±1/sqrt(fan_in): activations keep their scale through the layers.
      const double fan_in = d.dim() >= 2 ? static_cast<double>(d.size(-1)) : 64.0;
      const float a = static_cast<float>(1.0 / std::sqrt(fan_in));
      kernels::fill_uniform(d, seed ^ fnv1a(name), -a, a);
    }
  }
  model.params().run_post_load();
}

LoadedModel model_load(const std::string& model_dir, const ModelOptions& options,
                       LoadFormat format) {
  LoadedModel r;
  const ModelConfig config = model_config_load(model_dir);
  r.model = model_create(config, options);
  if (options.pp_size > 1 && !r.model->splits_into_stages())
    fail("{}: {} cannot be split into pipeline stages yet (--pipeline-parallel-size {}): its "
         "layer loop has no stage split",
         model_dir, config.architectures.at(0), options.pp_size);
  if (r.model->data_parallel_attention() && !r.model->supports_data_parallel_attention())
    fail("{}: {} runs attention tensor-parallel only (--data-parallel-size {}): data-parallel "
         "attention is implemented for the latent-attention models (DeepSeek-V2/V3/V3.2, Kimi-K2, "
         "GLM-5)",
         model_dir, config.architectures.at(0), r.model->data_parallel_size());
  if (format == LoadFormat::kDummy) {
    model_fill_dummy(*r.model);
    return r;
  }
  Checkpoint ckpt(model_dir);
  r.report = load_weights(r.model->params(), ckpt, r.model->weight_load_spec(),
                          checkpoint_options_from_env());
  return r;
}

}  // namespace atom
