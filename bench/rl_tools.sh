#!/usr/bin/env bash
# The multi-turn demo's workload on one GPU, at a larger batch: SFT from the calculator
# teacher (examples/rl-demo-tools-sft.yaml) on the GPU, then GRPO from it
# (examples/rl-demo-tools-grpo.yaml, PROMPTS (512) prompts x 16 samples a step, STEPS (6) steps)
# twice through bench/rl_job_rows.sh: multi-turn with the calculator
# (examples/servers/calculator_env.py, started here) and the same job single-turn (no
# environment: the model writes its own "observation" after a call). Every JSON line gets
# a "variant" key (multi_turn | single_turn). Run from the repository root with dist/.
#   bench/rl_tools.sh
set -uo pipefail
state=$(mktemp -d)
# The SFT checkpoint where the GRPO jobs' controllers may read it (their path roots hold the
# working directory; each `tessera local` has a state directory of its own).
ckpt=$PWD/.rl-tools/sft-ckpt
rm -rf "$ckpt"
if ! dist/bin/tessera local examples/rl-demo-tools-sft.yaml --state-dir "$state" --set groups.0.device=gpu \
    --set train.checkpoint.dir="$ckpt" > "$state/sft.log" 2>&1; then
  tail -5 "$state/sft.log" >&2
  exit 1
fi
tail -2 "$state/sft.log" >&2
read -r calculator address < <(bash scripts/start-example-server.sh calculator_env.py "$state/calculator.log") || exit 1
trap 'kill $calculator 2> /dev/null || true' EXIT
common=(--set groups.0.device=gpu --set groups.0.devices=1 --set groups.0.layout.dp=1
        --set train.checkpoint.load="$ckpt" --set rl.prompts_per_step="${PROMPTS:-512}"
        --set train.steps="${STEPS:-6}" --set rl.eval_every=1000)
rc=0
JOB_TIMEOUT=${JOB_TIMEOUT:-200} bench/rl_job_rows.sh examples/rl-demo-tools-grpo.yaml "${common[@]}" \
  --set rl.environment="$address" | sed 's/^{/{"variant": "multi_turn", /' || rc=1
JOB_TIMEOUT=${JOB_TIMEOUT:-200} bench/rl_job_rows.sh examples/rl-demo-tools-grpo.yaml "${common[@]}" \
  --set "rl.environment=''" --set "rl.tool_stop=''" --set rl.max_turns=1 | sed 's/^{/{"variant": "single_turn", /' || rc=1
exit $rc
