#include "models/loading.h"

#include <cmath>
#include <random>

#include "core/convert.h"
#include "core/error.h"
#include "core/log.h"

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
  for (const auto& [name, p] : model.params().all()) {
    Tensor& d = p->data();
    Tensor host = Tensor::empty(d.shape(), DType::kF32);
    float* v = host.ptr<float>();
    const int64_t n = host.numel();
    if (name.ends_with("norm.weight") && d.dim() == 1) {
      for (int64_t i = 0; i < n; ++i) v[i] = 1.0f;
    } else {
      // Uniform in ±1/sqrt(fan_in): activations keep their scale through the layers.
      const double fan_in = d.dim() >= 2 ? static_cast<double>(d.size(-1)) : 64.0;
      const float a = static_cast<float>(1.0 / std::sqrt(fan_in));
      std::mt19937_64 rng(seed ^ fnv1a(name));
      std::uniform_real_distribution<float> u(-a, a);
      for (int64_t i = 0; i < n; ++i) v[i] = u(rng);
    }
    tensor_assign(d, host);
  }
  model.params().run_post_load();
}

LoadedModel model_load(const std::string& model_dir, const ModelOptions& options, LoadFormat format) {
  LoadedModel r;
  const ModelConfig config = model_config_load(model_dir);
  r.model = model_create(config, options);
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
