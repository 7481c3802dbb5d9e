#!/usr/bin/env bash
# Where DP's weak-scaling loss at 4 GPUs comes from (one run on a 4-GPU host; dist/ from
# scripts/make-dist.sh): the ~1B Llama step (seq 4096, --micro M per GPU) on
#   1. one GPU alone;
#   2. four GPUs each running its own one-GPU job at once (no communication: what four
#      busy GPUs of the host cost — power, clocks, host CPUs);
#   3. dp4 (the data-parallel job).
# nvidia-smi samples SM clocks and power during each phase. Table last.
#   bash scripts/gpu-dp-control.sh on a host with 4 GPUs (after scripts/make-dist.sh)
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
M=${M:-4}
shape="--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256 --seq 4096 --steps 6 --warmup 3 --micro $M"
phase() {  # name, then the command; clocks sampled meanwhile
  nvidia-smi --query-gpu=index,clocks.sm,power.draw --format=csv,noheader,nounits -lms 500 > "$OUT/smi-$1.csv" &
  local smi=$!
  shift; "$@"; kill $smi 2>/dev/null; wait $smi 2>/dev/null
}
phase alone bash -c "CUDA_VISIBLE_DEVICES=0 timeout 150 dist/bin/train_bench $shape > $OUT/alone.jsonl"
phase four bash -c "for g in 0 1 2 3; do CUDA_VISIBLE_DEVICES=\$g timeout 150 dist/bin/train_bench $shape > $OUT/four-\$g.jsonl & done; wait"
phase dp4 bash -c "timeout 150 dist/bin/train_bench $shape --dp 4 > $OUT/dp4.jsonl"
cat "$OUT"/four-*.jsonl > "$OUT/four.jsonl"; rm -f "$OUT"/four-?.jsonl
python3 - "$OUT" "$card" "$M" <<'PY'
import json, sys, csv
out, card, m = sys.argv[1:]
def rows(f):
    try: return [json.loads(l) for l in open(f"{out}/{f}.jsonl") if l.startswith("{")]
    except FileNotFoundError: return []
def smi(p):  # the median SM clock of the GPUs that worked (over 200 W at some sample), the top power
    by = {}
    for r in csv.reader(open(f"{out}/smi-{p}.csv")):
        try: by.setdefault(int(r[0]), []).append((float(r[1]), float(r[2])))
        except (ValueError, IndexError): pass
    used = [sorted(c for c, _ in v) for v in by.values() if max(w for _, w in v) > 200]
    clk = sorted(v[len(v) // 2] for v in used) or [0]
    return clk[len(clk) // 2], max((w for v in by.values() for _, w in v), default=0)
print(f"\n== ~1B Llama, seq 4096, {m} micro-batches per GPU, {card}")
base = None
for p in ("alone", "four", "dp4"):
    rs = rows(p)
    if not rs: print(f"{p:6} failed"); continue
    ms = max(r["step_ms"] for r in rs)
    base = base or ms
    clk, pw = smi(p)
    print(f"{p:6} runs {len(rs)}  slowest {ms:7.1f} ms/step  ({base / ms:6.1%} of alone)  SM clock ~{clk:.0f} MHz  max power {pw:.0f} W"
          + (f"  dp wait {rs[0].get('dp_wait_ms', 0):.2f} ms" if p == "dp4" else ""))
PY
