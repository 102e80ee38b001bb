// `atom bench ...` is shared by several files (throughput and latency here, serve beside the
// server): each takes the one "bench" subcommand, creating it if it is the first.
#pragma once

#include <CLI/CLI.hpp>

namespace atom::cli {

inline CLI::App* bench_command(CLI::App& app) {
  auto named = app.get_subcommands([](CLI::App* s) { return s->get_name() == "bench"; });
  if (!named.empty()) return named.front();
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (like vllm bench)");
  bench->require_subcommand(1);
  return bench;
}

}  // namespace atom::cli
