// Building a model from a Hugging Face folder: registry lookup, parameters, then either the
// checkpoint's weights or seeded random ones (--load-format dummy).
#pragma once

#include <memory>
#include <string>

#include "models/model.h"

namespace atom {

enum class LoadFormat { kAuto, kSafetensors, kDummy };

// "auto", "safetensors" or "dummy"; anything else is an error naming the value.
LoadFormat load_format_parse(const std::string& s);

struct LoadedModel {
  std::unique_ptr<Model> model;
  LoadReport report;
};

LoadedModel model_load(const std::string& model_dir, const ModelOptions& options,
                       LoadFormat format = LoadFormat::kAuto);

// Fills every parameter with seeded random values (norm weights with ones), as vLLM's dummy
// load does; the same seed gives the same weights on every device.
void model_fill_dummy(Model& model, uint64_t seed = 0);

}  // namespace atom
