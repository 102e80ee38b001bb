// Shared pieces of the CUDA benchmarks: the measured ceilings of the project's H200, event
// timing, and a result table that prints the fraction of the limit.
#pragma once

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/cuda_check.h"

namespace atom::bench {

// Measured on the project's H200 (docs/performance.md): cuBLAS BF16 GEMV weight read, and
// cuBLAS BF16 GEMM 8192^3.
inline constexpr double kBandwidth = 4.29e12;  // bytes/s
inline constexpr double kMatmul = 797e12;      // FLOP/s

// "2048,8192" -> {2048, 8192}; "" gives an empty list.
inline std::vector<int> int_list(const std::string& s) {
  std::vector<int> r;
  size_t p = 0;
  while (p < s.size()) {
    const size_t c = s.find(',', p);
    r.push_back(std::atoi(s.substr(p, c == std::string::npos ? std::string::npos : c - p).c_str()));
    if (c == std::string::npos) break;
    p = c + 1;
  }
  return r;
}

// Median over `reps` of the mean time (s) of `iters` back-to-back calls of fn(i), i counting up
// (to rotate inputs), timed with events on the current stream (the legacy stream here).
inline double time_op(const std::function<void(int)>& fn, int iters = 20, int reps = 5,
                      int warmup = 3) {
  int k = 0;
  for (int i = 0; i < warmup; ++i) fn(k++);
  CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    CUDA_CHECK(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) fn(k++);
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3 / iters);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// One line: what, time, bytes/s and FLOP/s achieved, and the fraction of the binding limit.
inline void report(const std::string& what, double seconds, double bytes, double flops) {
  const double bw = bytes / seconds, fl = flops / seconds;
  const double t_mem = bytes / kBandwidth, t_math = flops / kMatmul;
  const bool mem_bound = t_mem >= t_math;
  const double pct = 100.0 * std::max(t_mem, t_math) / seconds;
  std::printf("%-58s %10.1f us %8.3f TB/s %8.1f TFLOP/s %6.1f%% of %s limit\n", what.c_str(),
              seconds * 1e6, bw / 1e12, fl / 1e12, pct, mem_bound ? "bandwidth" : "matmul");
  std::fflush(stdout);
}

}  // namespace atom::bench
