// The CPU's fp32 matrix-rate limit, measured: independent chains of fused multiply-adds on
// every thread, at the widest vector width the CPU has (AVX-512 or AVX2+FMA; SSE multiply + add
// otherwise). bench/cpu_demo_bench.py divides its FLOP rates by this.
//   build/bench/cpu_fma_peak [--threads N] [--seconds S]    prints "<GFLOP/s> <isa>"
#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kChains = 12;  // more than FMA latency x ports on current cores
constexpr long kInner = 1 << 16;

__attribute__((target("avx512f"))) double run_avx512(long reps) {
  __m512 acc[kChains];
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (auto& x : acc) x = _mm512_set1_ps(1.0f);
  for (long r = 0; r < reps; ++r)
    for (long i = 0; i < kInner; ++i)
      for (auto& x : acc) x = _mm512_fmadd_ps(x, a, b);
  alignas(64) float v[16];
  float s = 0;
  for (auto& x : acc) {
    _mm512_store_ps(v, x);
    for (float f : v) s += f;
  }
  return s;
}

__attribute__((target("avx2,fma"))) double run_avx2(long reps) {
  __m256 acc[kChains];
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (auto& x : acc) x = _mm256_set1_ps(1.0f);
  for (long r = 0; r < reps; ++r)
    for (long i = 0; i < kInner; ++i)
      for (auto& x : acc) x = _mm256_fmadd_ps(x, a, b);
  alignas(32) float v[8];
  float s = 0;
  for (auto& x : acc) {
    _mm256_store_ps(v, x);
    for (float f : v) s += f;
  }
  return s;
}

double run_sse(long reps) {  // x86-64 baseline: a multiply and an add count as one FMA
  __m128 acc[kChains];
  const __m128 a = _mm_set1_ps(0.999999f), b = _mm_set1_ps(1e-7f);
  for (auto& x : acc) x = _mm_set1_ps(1.0f);
  for (long r = 0; r < reps; ++r)
    for (long i = 0; i < kInner; ++i)
      for (auto& x : acc) x = _mm_add_ps(_mm_mul_ps(x, a), b);
  alignas(16) float v[4];
  float s = 0;
  for (auto& x : acc) {
    _mm_store_ps(v, x);
    for (float f : v) s += f;
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  double seconds = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(argv[i + 1]);
  }
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const int lanes = avx512 ? 16 : avx2 ? 8 : 4;
  const char* isa = avx512 ? "avx512f" : avx2 ? "avx2+fma" : "sse";
  auto kernel = [&](long reps) {
    return avx512 ? run_avx512(reps) : avx2 ? run_avx2(reps) : run_sse(reps);
  };
  // Calibrate one thread's repetitions to about `seconds`, then time every thread together.
  auto t0 = std::chrono::steady_clock::now();
  volatile double sink = kernel(4);
  const double per_rep =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 4;
  const long reps = std::max(1L, static_cast<long>(seconds / per_rep));
  std::atomic<double> total{0};
  std::vector<std::thread> pool;
  t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      const double s = kernel(reps);
      double cur = total.load();
      while (!total.compare_exchange_weak(cur, cur + s)) {
      }
    });
  for (auto& t : pool) t.join();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sink = sink + total.load();
  const double flops = 2.0 * lanes * kChains * static_cast<double>(kInner) * reps * threads;
  std::printf("%.2f %s\n", flops / dt / 1e9, isa);
  return 0;
}
