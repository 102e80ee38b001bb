// Pieces shared by the `atom bench` subcommands: random prompts, vLLM's benchmark sampling
// parameters, statistics as numpy computes them, and the --output-json writer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/sampling_params.h"

namespace atom::cli {

// Uniform random token ids in [0, vocab).
inline std::vector<int32_t> random_tokens(std::mt19937_64& rng, int len, int64_t vocab) {
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> r(static_cast<size_t>(std::max(0, len)));
  for (auto& t : r) t = id(rng);
  return r;
}

// vLLM's benchmarks: n=1, temperature 1, top_p 1, ignore_eos.
inline SamplingParams bench_params(int output_len) {
  SamplingParams p;
  p.temperature = 1.0;
  p.top_p = 1.0;
  p.ignore_eos = true;
  p.max_tokens = output_len;
  return p;
}

// numpy.percentile's default (linear interpolation between closest ranks).
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

inline double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

// Writes `j` to `path` (nothing when path is empty).
inline void write_json(const std::string& path, const nlohmann::json& j) {
  if (path.empty()) return;
  std::ofstream f(path);
  if (!f) fail("--output-json {}: cannot write the file", path);
  f << j.dump(4) << "\n";
}

}  // namespace atom::cli
