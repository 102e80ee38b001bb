#!/usr/bin/env bash
# Installs what atom needs to build and test on Debian 12 (run as root). Idempotent.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
pkgs=(build-essential cmake ninja-build pkg-config git
      nlohmann-json3-dev libfmt-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev libcli11-dev
      libxxhash-dev libgtest-dev python3 python3-jinja2 python3-numpy curl
      # src/vision: PNG and JPEG decoding.
      libpng-dev libjpeg62-turbo-dev
      # scripts/sanitize.sh: clang, its sanitizer and libFuzzer runtimes (-fsanitize=fuzzer links
      # libclang-rt-14-dev's; libfuzzer-14-dev's standalone libFuzzer.a is not needed), OpenMP for
      # clang, and llvm-symbolizer for readable reports.
      clang libclang-rt-14-dev libomp-14-dev llvm-14
      # scripts/check_format.sh: the pinned clang-format.
      clang-format-14
      # ccache (every build folder, C++ and nvcc: CMakeLists.txt) and lld (faster links).
      ccache lld
      # mpirun (Open MPI): the tests launch atom over two nodes with it, as TensorRT-LLM is launched.
      openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# Node.js and npm (tests against the Hugging Face tokenizers binding and the openai client): the
# machine's own when present (Debian's nodejs conflicts with a separately installed npm).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
fi
