#!/usr/bin/env bash
# Kernel checks and timings on a GPU (one run): the op harness on the GPU,
# compute-sanitizer memcheck over every CUDA op test and racecheck over the attention and RMSNorm
# tests (but the at-scale one, too slow under racecheck, and the cuDNN one: not our kernel), then the op benchmarks against
# PyTorch (scripts/gpu-bench.sh). Prints a short table last; logs go to $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
nvidia-smi -L | tee "$OUT/gpus.txt"
dist/bin/op_test --gtest_filter='*cuda*' > "$OUT/op_test.txt" 2>&1
op_rc=$?
grep -E "^\[  (FAILED|PASSED)|Failure|Which is|seed=|rror" "$OUT/op_test.txt" | head -40
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
mem_rc=-1 race_rc=-1
if [ -n "$san" ]; then
  "$san" --tool memcheck --error-exitcode 9 dist/bin/op_test --gtest_filter='*cuda*' > "$OUT/memcheck.txt" 2>&1
  mem_rc=$?
  "$san" --tool racecheck --error-exitcode 9 dist/bin/op_test --gtest_filter='*Attention*/cuda:*RmsNorm*/cuda:-*AtScale*:*Cudnn*' > "$OUT/racecheck.txt" 2>&1
  race_rc=$?
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard" "$OUT/memcheck.txt" "$OUT/racecheck.txt" | head -10
fi
bash scripts/gpu-bench.sh | tee "$OUT/bench.txt"
echo
echo "== $(head -1 "$OUT/gpus.txt")"
printf "%-40s %s\n" "op harness on GPU (op_test *cuda*)" "exit $op_rc ($(grep -c '^\[       OK' "$OUT/op_test.txt") ok, $(grep -c '^\[  FAILED  \].*ms)' "$OUT/op_test.txt") failed)"
printf "%-40s %s\n" "memcheck, all CUDA op tests" "exit $mem_rc"
printf "%-40s %s\n" "racecheck, attention + RMSNorm tests" "exit $race_rc"
