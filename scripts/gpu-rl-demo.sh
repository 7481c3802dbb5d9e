#!/usr/bin/env bash
# The RL demo's recipe on one GPU with larger models and a harder task (dist/ from
# scripts/make-dist.sh): SFT from the careless teacher, then GRPO (bench/grpo_arithmetic,
# engine level, f32), held-out accuracy every 10 GRPO steps. Logs in $OUT; a table last.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
run() {  # name, then grpo_arithmetic's flags
  local name=$1; shift
  local t0=$SECONDS
  timeout 280 dist/bin/grpo_arithmetic --device cuda --careless 0.6 --group 16 --prompts 64 --lr 1e-4 --warmup 5 \
    --kl 0.001 --eval 500 "$@" > "$OUT/$name.jsonl" 2> "$OUT/$name.err"
  echo "$name: exit $? in $((SECONDS - t0)) s"
}
run digits2_h512_l8 --digits 2 --hidden 512 --layers 8 --sft-steps 4000 --sft-lr 1e-3 --grpo-steps 60
run digits3_h384_l8 --digits 3 --hidden 384 --layers 8 --sft-steps 8000 --sft-lr 1e-3 --grpo-steps 60
python3 - "$OUT" "$card" <<'PY'
import json, sys, glob, os
out, card = sys.argv[1:]
print(f"\n== SFT (careless teacher) then GRPO on one {card}: held-out accuracy (greedy, 500 problems)")
for f in sorted(glob.glob(f"{out}/digits*.jsonl")):
    rows = [json.loads(l) for l in open(f) if l.startswith("{")]
    sft = [r for r in rows if r["phase"] == "sft"]
    grpo = [r for r in rows if r["phase"] == "grpo" and "accuracy" in r]
    steps = [r for r in rows if r["phase"] == "grpo"]
    last_sft = sft[-1] if sft else {}
    curve = " ".join(f"{r['step']}:{float(r['accuracy']):.3f}" for r in grpo)
    phases = {k: sum(r.get(k, 0) for r in steps[1:]) / max(1, len(steps) - 1) for k in ("generate_s", "ref_s", "old_s", "update_s")}
    print(f"{os.path.basename(f)[:-6]}: SFT {last_sft.get('step')} steps -> {float(last_sft.get('accuracy', 0)):.3f} "
          f"({last_sft.get('seconds', 0):.0f} s); GRPO {curve} ({steps[-1]['seconds'] - last_sft.get('seconds', 0):.0f} s)" if steps else f)
    print("   GRPO step phases (s): " + "  ".join(f"{k} {v:.3f}" for k, v in phases.items()))
PY
