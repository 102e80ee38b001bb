#include <cstdio>

#include "cli/command.h"

ATOM_REGISTER_COMMAND([](CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "Print atom's version");
  cmd->callback([] { std::printf("atom 0.1.0\n"); });
});
