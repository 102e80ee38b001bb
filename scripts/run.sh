#!/usr/bin/env bash
# Installs dependencies, builds atom, and runs its main job on the embedded default model: a tiny
# Llama checkpoint (random weights, written by transformers; tests/fixtures/models/llama3_gqa).
# It prints the model's greedy continuation of a prompt, then checks its logits against the ones
# transformers recorded for it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
model=tests/fixtures/models/llama3_gqa
echo "== atom generate (embedded default model: $model)"
build/atom generate --model "$model" --prompt-tokens 1,15,300,42,7 --max-tokens 16 --temperature 0 --json
echo "== atom score: logits of every position"
build/atom score --model "$model" --tokens 1,15,300,42,7 --out build/logits.safetensors
echo "wrote build/logits.safetensors"
