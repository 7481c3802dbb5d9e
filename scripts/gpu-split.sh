#!/usr/bin/env bash
# On a host with 2 GPUs, through `tessera local`, the 1B shape:
# GRPO with the rollout pool on its own GPU (examples/grpo-split-1b-gpu.yaml; the weights
# in f32 over NCCL) and with the rollout re-sliced on the actor's GPUs (TP 2 -> TP 1 x DP 2,
# examples/grpo-reslice-1b-gpu.yaml) and, on 4 GPUs, TP 4 -> TP 2 x DP 2
# (examples/grpo-reslice4-1b-gpu.yaml); first rollout_gpu_test (the rollout engine against
# the training engine, weight sync across two streams of a GPU); per-step phases and the
# sync's GB/s last. JOBS="split reslice ..." picks the jobs.
#   bash scripts/gpu-split.sh on a host with 2 GPUs (after scripts/make-dist.sh)
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
ngpu=$(nvidia-smi -L | wc -l)
timeout 120 dist/bin/rollout_gpu_test > "$OUT/rollout_gpu_test.txt" 2>&1
echo "rollout_gpu_test: exit $?"; grep -E "^\[  (FAILED|  OK) |Failure" "$OUT/rollout_gpu_test.txt" | head -12
jobs=${JOBS:-split reslice$([ "$ngpu" -ge 4 ] && echo " reslice4")}
for job in $jobs; do
  timeout ${JOB_TIMEOUT:-280} dist/bin/tessera local examples/grpo-$job-1b-gpu.yaml --state-dir "/tmp/state-$job" > "$OUT/$job.log" 2>&1
  echo "$job: tessera local exit $?"
  # the executors' logs, one file per job ($OUT returns few files)
  find "/tmp/state-$job/logs" -type f 2>/dev/null | sort | while read -r f; do echo "== $f"; tail -200 "$f"; done > "$OUT/$job-ranks.log"
  tail -3 "$OUT/$job.log"
done
python3 - "$OUT" "$card" $jobs <<'PY'
import re, sys
out, card, jobs = sys.argv[1], sys.argv[2], sys.argv[3:]
titles = {"split": "actor (1 GPU) and rollout pool (1 GPU): weights in f32 over NCCL",
          "reslice": "actor TP 2 and rollout TP 1 x DP 2 on the same 2 GPUs: re-sliced in each executor",
          "reslice4": "actor TP 4 and rollout TP 2 x DP 2 on the same 4 GPUs: re-sliced in each executor"}
for job in jobs:
    title = titles.get(job, job)
    rows, verified = [], False
    for line in open(f"{out}/{job}.log"):
        verified |= "SUCCEEDED" in line
        m = re.search(r"step (\d+)/\d+ reward", line)
        if m:
            rows.append((int(m.group(1)), dict(re.findall(r"(\w+)=([-\d.e+]+)", line))))
    print(f"\n== grpo 1B shape on {card}s, {title} (job {'succeeded: weights verified by digest' if verified else 'FAILED'})")
    print(f"{'step':>4} {'generate_s':>11} {'engine_s':>9} {'prefill_s':>9} {'decode_s':>9} {'graphs/decode':>14} {'update_s':>9} {'sync_s':>8} {'sync_GB/s':>10}")
    for step, kv in rows:
        f = lambda k: float(kv.get(k, 0))
        print(f"{step:4d} {f('generate_s'):11.3f} {f('rollout_engine_s'):9.3f} {f('prefill_s'):9.3f} {f('decode_s'):9.3f} "
              f"{f('graph_steps'):7.0f}/{f('decode_steps'):<6.0f} "
              f"{f('update_s'):9.3f} {f('sync_s'):8.3f} {f('sync_gb_per_s'):10.2f}")
PY
