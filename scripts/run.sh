#!/usr/bin/env bash
# Installs dependencies, builds atom, and shows it on the embedded default model: models/kjv-tiny,
# a 5.5M-parameter Llama trained on the King James Version (docs/demo_model.md). A text prompt goes
# in through `atom generate`, then through `atom serve` with one streaming curl request whose text
# is printed as it arrives. Last, the commands to serve it yourself and to serve a real checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
model=models/kjv-tiny
atom=build/atom
prompt="And God said,"
echo
echo "== atom generate --prompt '$prompt'   (embedded default model: $model, CPU, greedy)"
"$atom" generate --model "$model" --device cpu --prompt "$prompt" --max-tokens 48 2>/dev/null

echo
echo "== atom serve $model, then one streaming chat request with curl"
log="$(mktemp)"
"$atom" serve "$model" --device cpu --host 127.0.0.1 --port 0 --served-model-name kjv-tiny 2>"$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -f "$log"' EXIT
port=""
for _ in $(seq 1 240); do
  port="$(sed -n 's|.*serving .* at http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$log" | head -1)"
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.25
done
[ -n "$port" ] || { echo "atom serve did not start:"; cat "$log"; exit 1; }
question="Continue: Blessed are the poor in spirit:"
body="{\"model\": \"kjv-tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"$question\"}], \"stream\": true, \"max_tokens\": 64, \"temperature\": 0}"
echo "user: $question"
printf 'assistant (streamed): '
# The server sends Server-Sent Events; each chunk's delta is printed the moment it arrives.
curl -sN "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" |
  python3 -c '
import json, sys
for line in sys.stdin:
    if line.startswith("data: {"):
        for c in json.loads(line[6:])["choices"]:
            print(c["delta"].get("content") or "", end="", flush=True)
            reason = c.get("finish_reason")
            if reason:
                print("   [finish_reason: " + reason + "]", end="")
print()'
kill "$pid"
wait "$pid" 2>/dev/null || true

cat <<MSG

== next
Serve this model yourself (OpenAI-compatible API on port 8000):
  $atom serve $model --device cpu --port 8000
  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$model", "messages": [{"role": "user", "content": "Recite John 3:16."}]}'
Point it at a real checkpoint: any Hugging Face folder with config.json, *.safetensors and the
tokenizer files of a supported architecture (docs/supported_models.md), e.g.
  $atom serve /path/to/Qwen3-8B --port 8000                      # CUDA on an H200 build, else --device cpu
  $atom generate --model /path/to/Llama-3.1-8B-Instruct --chat --prompt "Hello" --max-tokens 64
MSG
