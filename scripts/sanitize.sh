#!/usr/bin/env bash
# The ASan+UBSan build (clang, CPU-only, in build-san) of the unit and server tests, and the
# libFuzzer harnesses of tests/fuzz, each fuzzed for ATOM_FUZZ_SECONDS (default 30; 45 until 2026-12-06); any
# sanitizer report, or a crash, leak or timeout the fuzzers find, fails. scripts/test.sh runs this
# after the model tests (ATOM_SANITIZE=0 skips it, and runs the unit and server tests in the plain
# build instead). A crash leaves its input in
# build-san/fuzz-artifacts/: copy it to tests/fuzz/regressions/<harness>/ with the fix. Each phase
# prints the seconds it took (docs/testing.md has CI's).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"
CC=clang CXX=clang++ cmake -S . -B build-san -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -gline-tables-only" "-DCMAKE_C_FLAGS_RELEASE=-O1 -gline-tables-only" \
  -DATOM_CUDA=OFF -DATOM_WERROR=OFF -DATOM_SANITIZE=address,undefined -DATOM_FUZZ=ON \
  -DATOM_FUZZ_SECONDS="${ATOM_FUZZ_SECONDS:-30}"
t=$SECONDS
# One build at a time on this machine (scripts/locked.sh); ccache and lld as in CMakeLists.txt.
scripts/locked.sh cmake --build build-san -j"$jobs" --target atom_sanitize_targets
echo "sanitize.sh: the build took $((SECONDS - t)) s"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ASAN_SYMBOLIZER_PATH="${ASAN_SYMBOLIZER_PATH:-/usr/lib/llvm-14/bin/llvm-symbolizer}"
cd build-san
t=$SECONDS
ctest --output-on-failure -L "unit|server" -LE gpu -j"$jobs" --timeout 900
echo "sanitize.sh: the unit and server tests took $((SECONDS - t)) s"
# One fuzzer at a time per core.
t=$SECONDS
ctest --output-on-failure -L fuzz -j"$jobs" --timeout 900
echo "sanitize.sh: the fuzzers took $((SECONDS - t)) s"
