#!/usr/bin/env bash
# Runs on a GPU host over the installed tree (dist/, built and bundled here):
#   1. a plain NCCL all-reduce loop (bench/nccl_allreduce_baseline) at 1 GiB;
#   2. `tessera local` comm-check with the NCCL backend on every visible GPU pair;
#   3. the baseline again (run-to-run spread).
# Writes logs and JSON under $OUT and prints a short table last.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
nvidia-smi -L | tee "$OUT/gpus.txt"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
ngpu=$(nvidia-smi -L | wc -l)
dist/bin/op_test 2>&1 | tee "$OUT/op_test.txt" | grep -E "^\[  (FAILED|PASSED|SKIPPED)|Failure|trace|seed=" | head -40
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$san" ]; then
  "$san" --tool memcheck --error-exitcode 9 dist/bin/op_test --gtest_filter='*cuda*' > "$OUT/memcheck.txt" 2>&1
  echo "compute-sanitizer memcheck on the CUDA op tests: exit $? ($(grep -c 'Invalid' "$OUT/memcheck.txt") invalid accesses)"
else
  echo "compute-sanitizer: not found"
fi
dist/bin/nccl_communicator_test 2>&1 | tee "$OUT/nccl_test.txt" | tail -3
b1=$(dist/bin/nccl_allreduce_baseline 1073741824 2>&1 | tee "$OUT/baseline1.txt" | tail -1)
state=$(mktemp -d)
set +e
dist/bin/tessera -o json local examples/comm-check-gpu.yaml --state-dir "$state" \
  --set groups.0.devices=$ngpu > "$OUT/comm_check.json" 2> "$OUT/comm_check.log"
rc=$?
set -e
cp -r "$state/logs" "$OUT/executor-logs" 2>/dev/null || true
b2=$(dist/bin/nccl_allreduce_baseline 1073741824 2>&1 | tee "$OUT/baseline2.txt" | tail -1)
tail -30 "$OUT/comm_check.log"
python3 - "$OUT/comm_check.json" "$b1" "$b2" "$card" "$rc" <<'PY'
import json, sys
path, b1, b2, card, rc = sys.argv[1:]
print(f"\n== {card}: comm-check exit code {rc}")
try:
    job = json.load(open(path))
    rows = json.loads(job.get("resultJson", "{}")).get("comm_check", [])
except Exception as e:
    print("no comm-check result:", e); rows = []
print(f"{'collective':15} {'size':>12} {'time_us':>10} {'busbw GB/s':>11}  check")
for r in rows:
    print(f"{r['collective']:15} {r['size']:>12} {r['time_us']:>10.1f} {r['busbw_gbps']:>11.2f}  {'ok' if r['errors']==0 else 'FAILED'}")
def bus(line):
    try: return float(line.split()[3])
    except Exception: return float('nan')
base = [bus(b1), bus(b2)]
ours = [r['busbw_gbps'] for r in rows if r['collective']=='all_reduce' and r['size']==1<<30]
print(f"plain NCCL all-reduce 1GiB busbw: {base[0]:.2f} / {base[1]:.2f} GB/s (before / after)")
if ours:
    print(f"comm-check  all-reduce 1GiB busbw: {ours[0]:.2f} GB/s = {ours[0]/max(base):.3f} of the better baseline run")
PY
