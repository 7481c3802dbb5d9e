#!/usr/bin/env bash
# Measured pipeline bubble against the ideal (pp - 1) / (vpp * m), on CPU slots of this
# machine: examples/pretrain-pipeline.yaml (pp 2, 8 layers, hidden 512; micro-batches of
# 128 arithmetic problems packed, ~1.6k tokens) through `tessera local` for vpp 1/2 and
# m = 4/8 micro-batches per step. The bubble of a step is
# the slowest stage's schedule time over the stages' mean busy time (outside receives),
# minus 1 (docs/training.md); the first step (warm-up) is left out and the rest averaged.
# One BLAS thread per stage, so that the two stages do not share cores' threads.
# DEVICE=gpu runs the same job on two GPUs (a GPU host: dist/bin/tessera) with a wider
# model (hidden 2048, ffn 8192), so that the stages' compute is not all launch latency.
#   [DEVICE=gpu] bench/pipeline_bubble.sh [build/bin/tessera] [steps]
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/bin/tessera} steps=${2:-6}
extra=(--set model.hidden=512 --set model.ffn=1536)
[ "${DEVICE:-cpu}" = gpu ] && extra=(--set groups.0.device=gpu --set model.hidden=2048 --set model.ffn=8192 --set model.num_heads=16 --set model.num_kv_heads=4)
state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT
printf "%-5s %-4s %-10s %-10s %s\n" m vpp ideal measured "per step"
for m in 4 8; do
  for v in 1 2; do
    out=$(OPENBLAS_NUM_THREADS=1 timeout 600 "$bin" local examples/pretrain-pipeline.yaml --state-dir "$state/$m-$v" \
      --set model.micro_batch=128 --set model.global_batch=$((128 * m)) --set groups.0.layout.vpp=$v \
      --set train.steps="$steps" "${extra[@]}" 2>&1)
    per=$(grep -oE "pipeline_bubble=[0-9.e+-]+" <<<"$out" | cut -d= -f2 | tail -n +2)
    [ -n "$per" ] || { echo "m=$m vpp=$v: no bubble reported"; tail -3 <<<"$out"; continue; }
    mean=$(awk '{s += $1; n++} END {printf "%.3f", s / n}' <<<"$per")
    ideal=$(awk -v m="$m" -v v="$v" 'BEGIN {printf "%.3f", 1 / (v * m)}')
    printf "%-5s %-4s %-10s %-10s %s\n" "$m" "$v" "$ideal" "$mean" "$(tr '\n' ' ' <<<"$per")"
  done
done
