// Options shared by the commands that load a model.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/loading.h"

namespace atom::cli {

struct ModelArgs {
  std::string model;
  std::string device;  // empty: cuda when a GPU is present, else cpu
  std::string load_format = "auto";
};

void model_args_add(CLI::App* cmd, ModelArgs& a);
// Loads the model, logging each phase with its time.
LoadedModel model_args_load(const ModelArgs& a);

// "1,2,3" -> {1, 2, 3}; an error naming `flag` on anything else.
std::vector<int32_t> token_list_parse(const std::string& s, const std::string& flag);

}  // namespace atom::cli
