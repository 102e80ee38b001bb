#!/usr/bin/env bash
# Runs on the GPU machine, in the checkout the device tool sent (with .gpu-deps from
# tools/gpu_prepare.sh carried; run that right before each call: it records the commit, which the
# summary prints, since the sent checkout has no .git): unpacks the Debian packages into a prefix, builds every GPU
# binary (atom, gpu_test, the bench programs) into build-gpu/ with all the machine's cores, prints
# the build's time, then runs tools/gpu_session.sh with the steps given (default `tests`; `none`
# builds only). The build log and the session's logs go to $OUT.
#   bash tools/gpu_build.sh [steps]            e.g. bash tools/gpu_build.sh tests,mla
# ATOM_GPU_TARGETS overrides the targets (default: atom gpu_test and every cuda_* bench);
# ATOM_GPU_SESSION=tp runs tools/gpu_tp_session.sh instead.
set -uo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-/tmp/atom-out}"
mkdir -p "$out"
deps="$src/.gpu-deps"
prefix=/tmp/atom-deps
if [ ! -f "$deps/prefix.tar.xz" ] && [ ! -d "$deps/debs" ]; then
  echo "gpu_build.sh: no .gpu-deps/prefix.tar.xz: run tools/gpu_prepare.sh here and carry .gpu-deps" >&2
  exit 2
fi
t0=$SECONDS
rm -rf "$prefix" && mkdir -p "$prefix"
if [ -f "$deps/prefix.tar.xz" ]; then
  tar -C "$prefix" -xJf "$deps/prefix.tar.xz"
else
  for f in "$deps"/debs/*.deb; do dpkg -x "$f" "$prefix"; done
fi
arch=x86_64-linux-gnu
libdir="$prefix/usr/lib/$arch"
export LD_LIBRARY_PATH="$libdir:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# pkg-config reads only the prefix's files and prepends the prefix to their paths.
export PKG_CONFIG_LIBDIR="$libdir/pkgconfig:$prefix/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$prefix"
pkgconf=()
if ! command -v pkg-config >/dev/null 2>&1; then
  pkgconf=(-DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf")
fi
# NCCL: the CUDA toolkit's when it has one, else the Python image's wheel (nvidia-nccl-cu13).
nccl=()
if [ ! -f /usr/local/cuda/include/nccl.h ]; then
  nd="$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)"
  if [ -n "$nd" ] && [ -f "$nd/include/nccl.h" ]; then
    lib="$(ls "$nd"/lib/libnccl.so* | head -1)"
    nccl=(-DATOM_NCCL_INCLUDE_DIR="$nd/include" -DATOM_NCCL_LIBRARY="$lib")
    export LD_LIBRARY_PATH="$nd/lib:$LD_LIBRARY_PATH"
  fi
fi
export PATH="/usr/local/cuda/bin:$PATH"
echo "gpu_build.sh: the build dependencies unpacked in $((SECONDS - t0)) s; $(nproc) cores; $(cat "$deps/COMMIT" 2>/dev/null | head -1)"
t=$SECONDS
cmake -S "$src" -B "$src/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATOM_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH="$prefix/usr" \
  -DCMAKE_INCLUDE_PATH="$prefix/usr/include" -DCMAKE_LIBRARY_PATH="$libdir" \
  -DCMAKE_CXX_FLAGS="-isystem $prefix/usr/include" -DCMAKE_CUDA_FLAGS="-isystem $prefix/usr/include" \
  -DCMAKE_EXE_LINKER_FLAGS="-L$libdir -Wl,-rpath-link,$libdir" \
  "${pkgconf[@]}" "${nccl[@]}" > "$out/build.log" 2>&1 || {
  tail -n 40 "$out/build.log"; echo "gpu_build.sh: configure failed"; exit 3; }
targets="${ATOM_GPU_TARGETS:-atom gpu_test $(cd "$src/bench" && ls cuda_*.cpp | sed 's/\.cpp$//' | tr '\n' ' ')}"
# shellcheck disable=SC2086
if ! cmake --build "$src/build-gpu" -j"$(nproc)" --target $targets >> "$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -40
  echo "gpu_build.sh: the build failed after $((SECONDS - t)) s (build.log)"
  exit 4
fi
built="gpu_build.sh: configured and built [$targets] in $((SECONDS - t)) s on $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')"
echo "$built"
# The layout gpu_session.sh reads: bin/ (the programs), lib/ (shared libraries the image lacks).
stage="$src/build-gpu"
mkdir -p "$stage/bin" "$stage/lib"
# (The globs expand under $stage: a bare bench/cuda_* would match the sources' bench/cuda_*.cpp.)
for f in "$stage"/atom "$stage"/tests/kernels/gpu_test "$stage"/bench/cuda_*; do
  [ -x "$f" ] && [ -f "$f" ] && ln -sf "$f" "$stage/bin/$(basename "$f")"
done
cp -a "$libdir"/libcpp-httplib.so* "$libdir"/libbrotli*.so* "$libdir"/libfmt.so* "$stage/lib/" 2>/dev/null
cp "$deps/COMMIT" "$stage/COMMIT" 2>/dev/null || echo unknown > "$stage/COMMIT"
echo "$built" > "$stage/BUILD_TIME"
if [ -f "$deps/llama-3.1-8b-tok.tar.gz" ]; then
  rm -rf "$src/bench/models/llama-3.1-8b-tok" && tar -C "$src/bench/models" -xzf "$deps/llama-3.1-8b-tok.tar.gz"
fi
ldd "$stage/bin/atom" | grep "not found" && echo "gpu_build.sh: atom lacks libraries"
steps="${1:-tests}"
[ "$steps" = none ] && exit 0
export ATOM_GPU_STAGE="$stage"
if [ "${ATOM_GPU_SESSION:-}" = tp ]; then
  exec bash "$src/tools/gpu_tp_session.sh" "$steps"
fi
exec bash "$src/tools/gpu_session.sh" "$steps"
