// Engine options shared by the commands that run the engine (generate, bench), with vLLM's names.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/engine_config.h"

namespace atom::cli {

struct EngineArgs {
  EngineConfig config;
  std::string kv_cache_memory;  // empty: the default
};

void engine_args_add(CLI::App* cmd, EngineArgs& a);
EngineConfig engine_args_config(const EngineArgs& a);

}  // namespace atom::cli
