// The `atom` program: subcommands are registered by the cmd_*.cpp files.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

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
  // vLLM's `-tp N` / `-tp=N`, `-pp N` and `-ep`: CLI11 takes one-character short names only, so the
  // spellings are rewritten to --tensor-parallel-size, --pipeline-parallel-size and
  // --enable-expert-parallel before parsing.
  std::vector<std::string> args(argv, argv + argc);
  for (std::string& a : args) {
    if (a == "-tp" || a.rfind("-tp=", 0) == 0) a = "--tensor-parallel-size" + a.substr(3);
    if (a == "-pp" || a.rfind("-pp=", 0) == 0) a = "--pipeline-parallel-size" + a.substr(3);
    if (a == "-dp" || a.rfind("-dp=", 0) == 0) a = "--data-parallel-size" + a.substr(3);
    if (a == "-ep") a = "--enable-expert-parallel";
  }
  std::vector<char*> args_c;
  for (std::string& a : args) args_c.push_back(a.data());
  try {
    app.parse(static_cast<int>(args_c.size()), args_c.data());
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
