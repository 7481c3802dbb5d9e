#!/usr/bin/env bash
# Sets everything up, builds, and runs the whole test suite (unit, integration; GPU
# tests skip where there is no GPU), then the fuzzers for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
(cd build && ctest --output-on-failure -j "${TESSERA_TEST_JOBS:-2}" --timeout 600 "$@")
# The libFuzzer targets (fuzz/), each for FUZZ_SECONDS (default 20) from its corpus.
bash scripts/fuzz.sh
