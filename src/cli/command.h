// Subcommands of the `atom` program register themselves: one file per command, no central list.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <vector>

namespace atom::cli {

using CommandSetup = std::function<void(CLI::App& app)>;

std::vector<CommandSetup>& command_setups();

struct CommandRegistrar {
  explicit CommandRegistrar(CommandSetup setup) { command_setups().push_back(std::move(setup)); }
};

}  // namespace atom::cli

#define ATOM_CLI_CONCAT_(a, b) a##b
#define ATOM_CLI_CONCAT(a, b) ATOM_CLI_CONCAT_(a, b)
// ATOM_REGISTER_COMMAND([](CLI::App& app) { auto* cmd = app.add_subcommand("x", "..."); ... });
// The setup adds a subcommand and its callback (which runs the command).
#define ATOM_REGISTER_COMMAND(setup) \
  static ::atom::cli::CommandRegistrar ATOM_CLI_CONCAT(atom_cli_registrar_, __LINE__)(setup)
