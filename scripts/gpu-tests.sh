#!/usr/bin/env bash
# Every GPU-labelled test on a GPU host, in one command, over the installed tree (dist/,
# from scripts/make-dist.sh on a CUDA build):
#   bash scripts/gpu-tests.sh            # OUT=/tmp/tessera-gpu-out unless set
# Runs the CUDA instances of the op harness, the model and trainer oracles on GPUs, the
# rollout engine against the trainer, the NCCL communicator and the CUPTI trace tests,
# then `tessera local` comm-check on every visible GPU (the agent's GPU discovery, NCCL
# through the daemons). Each test program's gtest JSON lands in $OUT; one table is
# printed last. Exit status 1 when any test failed; skips are listed by name (a test
# that needs more GPUs than the host has skips). With SANITIZE=1 the CUDA op tests also
# run under compute-sanitizer: memcheck over all of them, racecheck over the kernels with
# shared memory (attention, RMSNorm; not the at-scale case, too slow under racecheck,
# nor the cases that run cuDNN's attention, not our kernel: racecheck reports hazards
# inside cuDNN's generated SDPA kernel).
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
ngpu=$(nvidia-smi -L | wc -l)
echo "== $ngpu x $card"
declare -A filter=([op_test]='*/cuda' [llama_cuda_test]='*' [trainer_gpu_test]='*' [rollout_gpu_test]='*'
                   [nccl_communicator_test]='*' [cupti_trace_test]='*')
for t in op_test llama_cuda_test trainer_gpu_test rollout_gpu_test nccl_communicator_test cupti_trace_test; do
  if [ ! -x "dist/bin/$t" ]; then echo "$t: not installed" > "$OUT/$t.txt"; continue; fi
  timeout "${GPU_TEST_TIMEOUT:-540}" "dist/bin/$t" --gtest_filter="${filter[$t]}" \
    --gtest_output="json:$OUT/$t.json" > "$OUT/$t.txt" 2>&1
  echo "$t: exit $?"
  grep -E "^\[  FAILED  \]|Failure" "$OUT/$t.txt" | head -10
done
state=$(mktemp -d)
timeout 300 dist/bin/tessera -o json local examples/comm-check-gpu.yaml --state-dir "$state" \
  --set groups.0.devices="$ngpu" --set groups.0.layout.dp="$ngpu" > "$OUT/comm_check.json" 2> "$OUT/comm_check.log"
echo "tessera local comm-check on $ngpu GPUs: exit $?" | tee "$OUT/comm_check.rc"
tail -5 "$OUT/comm_check.log"
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
: > "$OUT/sanitizer.rc"
if [ "${SANITIZE:-0}" = 1 ] && [ -n "$san" ]; then
  "$san" --tool memcheck --error-exitcode 9 dist/bin/op_test --gtest_filter='*/cuda' > "$OUT/memcheck.txt" 2>&1
  echo "memcheck $?" >> "$OUT/sanitizer.rc"
  "$san" --tool racecheck --error-exitcode 9 dist/bin/op_test \
    --gtest_filter='*Attention*/cuda:*RmsNorm*/cuda:-*AtScale*:*Cudnn*:*PrepareAttention*' > "$OUT/racecheck.txt" 2>&1
  echo "racecheck $?" >> "$OUT/sanitizer.rc"
fi
python3 - "$OUT" "$card" "$ngpu" <<'PY'
import json, os, sys
out, card, ngpu = sys.argv[1:]
failed = 0
print(f"\n== GPU tests ({ngpu} x {card})")
print(f"{'program':<26} {'tests':>6} {'passed':>7} {'failed':>7} {'skipped':>8}")
for t in ["op_test", "llama_cuda_test", "trainer_gpu_test", "rollout_gpu_test", "nccl_communicator_test",
          "cupti_trace_test"]:
    path = f"{out}/{t}.json"
    if not os.path.exists(path):
        print(f"{t:<26} {'no result (crashed, timed out or not installed)':>30}"); failed += 1; continue
    r = json.load(open(path))
    cases = [c for s in r.get("testsuites", []) for c in s.get("testsuite", [])]
    skipped = [c["name"] for c in cases if c.get("result") == "SKIPPED"]
    bad = [c["name"] for c in cases if c.get("failures")]
    failed += len(bad)
    print(f"{t:<26} {len(cases):>6} {len(cases) - len(skipped) - len(bad):>7} {len(bad):>7} {len(skipped):>8}")
    for n in bad: print(f"    FAILED  {n}")
    for n in skipped: print(f"    skipped {n}")
rc = open(f"{out}/comm_check.rc").read().strip()
ok = rc.endswith("exit 0")
try:
    job = json.load(open(f"{out}/comm_check.json"))
    ok = ok and job.get("state") == "JOB_STATE_SUCCEEDED"
except Exception:
    ok = False
print(f"{'tessera local comm-check':<26} {'':>6} {'ok' if ok else 'FAILED':>7}")
failed += 0 if ok else 1
for line in open(f"{out}/sanitizer.rc"):
    tool, rc = line.split()
    print(f"{'compute-sanitizer ' + tool:<26} {'':>6} {'ok' if rc == '0' else 'FAILED (exit ' + rc + ')':>7}")
    failed += rc != "0"
sys.exit(1 if failed else 0)
PY
