#!/usr/bin/env bash
# The reasoning workload end to end on one GPU: math word problems
# (scripts/make-math-problems.py: 20,000 training problems with worked solutions, 500
# held out), SFT of a small Qwen3-shaped model from a random start
# (examples/math-sft-gpu.yaml), then GRPO from its checkpoint with held-out accuracy
# (examples/math-grpo-gpu.yaml). Prints each job's per-step rows as JSON lines
# ({"job": "sft"|"grpo", "step": N, ...}) and the held-out curve last. Needs dist/ and
# third_party/tokenizers/qwen3 (scripts/setup.sh fetches it). Arguments go to both jobs
# (e.g. --set train.steps=...); SFT_ARGS / GRPO_ARGS to one.
#   bash bench/math_learning.sh
set -uo pipefail
rm -rf .math
python3 scripts/make-math-problems.py --out .math --train 20000 --eval 500 || exit 1
rows() {  # job label, log
  python3 - "$1" "$2" <<'PY'
import json, re, sys
for line in open(sys.argv[2], errors="replace"):
    m = re.search(r"step (\d+)/\d+ ", line)
    a = re.search(r"held-out accuracy at the start: ([\d.]+)", line)
    if m or a:
        r = {"job": sys.argv[1], "step": int(m.group(1)) if m else 0}
        r.update({k: float(v) for k, v in re.findall(r"(\w+)=([-\d.e+]+)", line)})
        if a:
            r["accuracy"] = float(a.group(1))
        print(json.dumps(r))
PY
}
state=$(mktemp -d)
run() {  # label, job file, time limit, then the job's arguments: its rows and a summary line
  local label=$1 job=$2 limit=$3 t0 rc
  shift 3
  t0=$(date +%s)
  timeout "$limit" dist/bin/tessera local "$job" --state-dir "$state/$label" "$@" > "$state/$label.log" 2>&1
  rc=$?
  tail -2 "$state/$label.log" >&2
  rows "$label" "$state/$label.log"
  echo "{\"job\": \"$label\", \"summary\": true, \"succeeded\": $([ $rc = 0 ] && echo true || echo false), \"seconds\": $(( $(date +%s) - t0 ))}"
  return $rc
}
# shellcheck disable=SC2086
run sft examples/math-sft-gpu.yaml "${SFT_TIMEOUT:-240}" "$@" ${SFT_ARGS:-} || exit
# shellcheck disable=SC2086
run grpo examples/math-grpo-gpu.yaml "${GRPO_TIMEOUT:-300}" "$@" ${GRPO_ARGS:-}
rc=$?
grep -o "held-out accuracy[^=]*" "$state/grpo.log" >&2
exit $rc
