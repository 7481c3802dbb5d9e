#!/usr/bin/env bash
# Configures and builds Tessera with Ninja into ./build (CUDA targets when nvcc exists).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${TESSERA_BUILD_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${TESSERA_CMAKE_ARGS:-}
ninja -C build -j "$jobs"
