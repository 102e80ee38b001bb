// The `atom` program: subcommands are registered by the cmd_*.cpp files.
#include <cstdio>
#include <exception>

#include "cli/command.h"
#include "core/error.h"

namespace atom::cli {
std::vector<CommandSetup>& command_setups() {
  static std::vector<CommandSetup> setups;
  return setups;
}
}  // namespace atom::cli

int main(int argc, char** argv) {
  CLI::App app{"atom: a C++/CUDA engine that serves large language models"};
  app.require_subcommand(1);
  for (auto& setup : atom::cli::command_setups()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const atom::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
