#!/usr/bin/env bash
# On a lent host with 2 GPUs (kind nvidia-h100-x2): GRPO with the rollout pool on its own
# GPU (examples/grpo-split-1b-gpu.yaml, the 1B shape) through `tessera local`; prints the
# per-step phases and the weight sync's GB/s (the model in f32 over NCCL) last.
#   bash scripts/make-dist.sh; run(command="bash scripts/gpu-split.sh", carry=[".carry"], kind="nvidia-h100-x2")
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
timeout 500 dist/bin/tessera local examples/grpo-split-1b-gpu.yaml --state-dir "$OUT/state" > "$OUT/split.log" 2>&1
echo "tessera local: exit $?"
tail -5 "$OUT/split.log"
python3 - "$OUT/split.log" "$card" <<'PY'
import re, sys
log, card = sys.argv[1:]
rows = []
for line in open(log):
    m = re.search(r"step (\d+)/\d+ reward", line)
    if not m:
        continue
    kv = dict(re.findall(r"(\w+)=([-\d.e+]+)", line))
    rows.append((int(m.group(1)), kv))
print(f"\n== grpo, actor and rollout pool on two {card}s (1B shape, weights in f32 over NCCL)")
print(f"{'step':>4} {'generate_s':>11} {'update_s':>9} {'sync_s':>8} {'sync_GB/s':>10}")
for step, kv in rows:
    print(f"{step:4d} {float(kv.get('generate_s', 0)):11.3f} {float(kv.get('update_s', 0)):9.3f} "
          f"{float(kv.get('sync_s', 0)):8.3f} {float(kv.get('sync_gb_per_s', 0)):10.2f}")
PY
