#!/usr/bin/env bash
# The benchmark suites on a GPU host, over the installed tree (dist/, from
# scripts/make-dist.sh on a CUDA build), each against its peer in the same call:
#   bash scripts/gpu-bench.sh SUITE...       # kernels train scale decode decode_gemm decode_ab rl rl_long rl_math rl_math_ppo rl_async rl_reward rl_offload rl_tools prefix rl_math4 rl_math4_ppo rollout_rl tokenizers qwen3 qwen25_7b
# A suite is data (bench/suites/SUITE.json: its commands and how its table's rows pair
# Tessera's records with the peer's); bench/suites.py runs it and prints one table per
# suite last (benchmark, unit, Tessera, peer, ratio, fraction of the hardware limit).
# Runs that need more GPUs than the host has are skipped. Every run's output and each
# suite's table (SUITE.md) land in $OUT (default /tmp/tessera-gpu-out).
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
[ $# -gt 0 ] || set -- kernels train decode rl tokenizers scale
python3 bench/suites.py --out "$OUT" "$@"
