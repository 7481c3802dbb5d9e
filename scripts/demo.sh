#!/usr/bin/env bash
# Sets everything up, builds, and runs the RL demo on `tessera local` (CPU, a few
# minutes): SFT warm start on 2-digit addition from a careless teacher that drops 80% of
# the carries (examples/rl-demo-sft.yaml), then GRPO with an exact-match reward on the
# true sums from that checkpoint (examples/rl-demo-grpo.yaml, data parallel 2). GRPO
# prints the held-out accuracy (greedy, problems no job trained on) at the start and every
# 10 steps, and saves the trained policy in $state/grpo-ckpt (a `generate` job's
# generate.checkpoint); docs/rl.md has a recorded run. Arguments go to the GRPO job (e.g.
# --set train.steps=60). The comm-check of every parallel group: examples/comm-check.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
state=$(mktemp -d /tmp/tessera-demo.XXXXXX)
echo "== 1/2: SFT warm start (state in $state)"
./build/bin/tessera local examples/rl-demo-sft.yaml --state-dir "$state" --set train.checkpoint.dir="$state/sft-ckpt"
echo "== 2/2: GRPO from the SFT checkpoint"
exec ./build/bin/tessera local examples/rl-demo-grpo.yaml --state-dir "$state" --set train.checkpoint.load="$state/sft-ckpt" \
  --set train.checkpoint.dir="$state/grpo-ckpt" "$@"
