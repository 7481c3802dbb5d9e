#!/usr/bin/env bash
# Runs an RL job through the daemons (`tessera local JOB.yaml`) and prints its per-step
# metrics as JSON lines ({"step": N, "generate_s": ..., ...}), then one line with their
# means over the steps after the first ({"summary": true, ...}) and whether the job
# succeeded (bench/suites.py reads them). Run from the repository root with dist/ installed.
# Arguments after the job file go to `tessera local` (e.g. --set rl.prompts_per_step=16).
# With FLOPS_PER_TOKEN (the model FLOPs of one token through a step's passes over the
# samples: reference and old log-probs, the update), each row also has update_tflops;
# with REWARD_FLOPS_PER_TOKEN (a reward model's forward FLOPs per token), reward_tflops.
# With SMI_PEAK=1, nvidia-smi's memory.used is sampled every second while the job runs and
# the summary has its largest value over the GPUs (smi_peak_mib).
#   bench/rl_job_rows.sh examples/grpo-split-1b-gpu.yaml
set -uo pipefail
job=$1
shift
state=$(mktemp -d)
smi=""
if [ "${SMI_PEAK:-0}" = 1 ]; then
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 1000 > "$state/smi" 2>/dev/null &
  smi=$!
fi
timeout "${JOB_TIMEOUT:-280}" dist/bin/tessera local "$job" --state-dir "$state" "$@" > "$state/job.log" 2>&1
rc=$?
[ -n "$smi" ] && kill "$smi" 2>/dev/null
tail -3 "$state/job.log" >&2
python3 - "$state/job.log" "$rc" "${FLOPS_PER_TOKEN:-0}" "${REWARD_FLOPS_PER_TOKEN:-0}" "$state/smi" <<'PY'
import json, os, re, sys
flops, reward_flops = float(sys.argv[3]), float(sys.argv[4])
rows = []
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"step (\d+)/\d+ reward", line)
    if m:
        r = {"step": int(m.group(1))}
        r.update({k: float(v) for k, v in re.findall(r"(\w+)=([-\d.e+]+)", line)})
        if flops and r.get("train_tokens_per_s"):
            r["update_tflops"] = r["train_tokens_per_s"] * flops / 1e12
        if reward_flops and r.get("reward_tokens_per_s"):
            r["reward_tflops"] = r["reward_tokens_per_s"] * reward_flops / 1e12
        rows.append(r)
for r in rows:
    print(json.dumps(r))
later = rows[1:] or rows
keys = sorted({k for r in later for k in r if k != "step"})
summary = {k: sum(r.get(k, 0.0) for r in later) / len(later) for k in keys} if later else {}
summary.update({"summary": True, "steps": len(rows), "succeeded": sys.argv[2] == "0"})
if os.path.exists(sys.argv[5]):
    used = [float(l) for l in open(sys.argv[5]) if l.strip().replace(".", "", 1).isdigit()]
    if used:
        summary["smi_peak_mib"] = max(used)
print(json.dumps(summary))
PY
exit $rc
