#!/usr/bin/env bash
# Sets everything up, builds, and runs the RL demo on `tessera local` (CPU, a few
# minutes): SFT warm start on 2-digit addition from a careless teacher that drops 80% of
# the carries (examples/rl-demo-sft.yaml), then GRPO with an exact-match reward on the
# true sums from that checkpoint (examples/rl-demo-grpo.yaml, data parallel 2). GRPO
# prints the held-out accuracy (greedy, problems no job trained on) at the start and every
# 10 steps, and saves the trained policy in $state/grpo-ckpt (a `generate` job's
# generate.checkpoint); docs/rl.md has a recorded run. Arguments go to the GRPO job (e.g.
# --set train.steps=60). The comm-check of every parallel group: examples/comm-check.yaml.
#
# `demo.sh --tools`: the multi-turn variant — the SFT teacher also answers a quarter of the
# problems through a calculator call (examples/rl-demo-tools-sft.yaml), and GRPO runs with
# the calculator as its environment (examples/servers/calculator_env.py, started here on a
# free loopback port; examples/rl-demo-tools-grpo.yaml): the policy learns to call it.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=0
if [ "${1:-}" = "--tools" ]; then tools=1; shift; fi
bash scripts/setup.sh
bash scripts/build.sh
state=$(mktemp -d /tmp/tessera-demo.XXXXXX)
if [ $tools = 0 ]; then
  echo "== 1/2: SFT warm start (state in $state)"
  ./build/bin/tessera local examples/rl-demo-sft.yaml --state-dir "$state" --set train.checkpoint.dir="$state/sft-ckpt"
  echo "== 2/2: GRPO from the SFT checkpoint"
  exec ./build/bin/tessera local examples/rl-demo-grpo.yaml --state-dir "$state" --set train.checkpoint.load="$state/sft-ckpt" \
    --set train.checkpoint.dir="$state/grpo-ckpt" "$@"
fi
echo "== 1/2: SFT warm start with calculator calls (state in $state)"
./build/bin/tessera local examples/rl-demo-tools-sft.yaml --state-dir "$state" --set train.checkpoint.dir="$state/sft-ckpt"
read -r calculator address < <(bash scripts/start-example-server.sh calculator_env.py "$state/calculator.log") || exit 1
trap 'kill $calculator 2> /dev/null || true' EXIT
echo "== 2/2: GRPO from the SFT checkpoint, the calculator at $address"
./build/bin/tessera local examples/rl-demo-tools-grpo.yaml --state-dir "$state" --set train.checkpoint.load="$state/sft-ckpt" \
  --set train.checkpoint.dir="$state/grpo-ckpt" --set rl.environment="$address" "$@"
