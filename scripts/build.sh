#!/usr/bin/env bash
# Configures and builds atom into build/ (CUDA backend when nvcc is present; ATOM_CUDA=OFF for CPU only).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DATOM_CUDA="${ATOM_CUDA:-AUTO}" ${ATOM_CMAKE_ARGS:-}
# One build at a time on this machine (scripts/locked.sh); ccache and lld when installed (CMakeLists.txt).
t=$SECONDS
scripts/locked.sh cmake --build build -j"$(nproc)" ${ATOM_BUILD_TARGETS:+--target $ATOM_BUILD_TARGETS}
echo "build.sh: the build took $((SECONDS - t)) s"
