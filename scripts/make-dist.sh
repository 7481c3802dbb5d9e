#!/usr/bin/env bash
# Builds here (CUDA on) and packs what a GPU host needs into .carry/dist.tar.xz:
# the installed programs, GPU tests and benchmarks (dist/bin), the libraries a bare GPU
# host lacks (scripts/bundle-runtime.sh) and OpenBLAS, which the CPU GEMM
# loads at first use (kernels/gemm/gemm_cpu.cc), so ldd does not list it.
# Copy the repository with .carry/ to the GPU host and run scripts/gpu-tests.sh or
# scripts/gpu-bench.sh there (scripts/gpu-env.sh unpacks it).
set -euo pipefail
cd "$(dirname "$0")/.."
# A build of its own with CUDA on (BUILD_DIR, default build-cuda), configured on first use.
build=${BUILD_DIR:-build-cuda}
[ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -G Ninja -DTESSERA_CUDA=ON -DCMAKE_BUILD_TYPE=Release
cmake --build "$build"
rm -rf dist && cmake --install "$build" --prefix dist > /dev/null
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libopenblas.so.0)
mkdir -p dist/lib && cp -L "$blas" dist/lib/libopenblas.so.0
scripts/bundle-runtime.sh dist/lib dist/bin/* dist/lib/libopenblas.so.0
# For train_bench --trace, in a folder of its own (on the library path only when
# tracing): a libcupti where the host has none.
mkdir -p dist/prof-lib
for l in /usr/local/cuda/lib64/libcupti.so.13 /usr/local/cuda/lib/libcupti.so.13; do
  [ -e "$l" ] && cp -L "$l" dist/prof-lib/
done
strip dist/bin/* 2>/dev/null || true
mkdir -p .carry && XZ_OPT=-3 tar -cJf .carry/dist.tar.xz dist && rm -rf dist
ls -la .carry/dist.tar.xz
