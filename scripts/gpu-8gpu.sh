#!/usr/bin/env bash
# The eight-GPU checks on one 8-GPU host (H100 or H200), in one run (dist/ from
# scripts/make-dist.sh; ~8 minutes):
#   1. a plain NCCL all-reduce loop at 1 GiB over the 8 GPUs (bench/nccl_allreduce_baseline),
#      comm-check (`tessera local`, examples/comm-check-8gpu.yaml) of every group of tp8 and
#      of tp2 x dp2 x pp2, the loop again: comm-check's 1 GiB all-reduce over the tp8 group
#      (all 8 GPUs) against the better loop run (the goal: within 5%);
#   2. the eight-rank oracle layouts in bf16 (trainer_gpu_test tp2_pp2_dp2_zero1, tp2_sp_cp2_pp2);
#   3. an 8B Llama shape (hidden 4096, 32 layers, 32 / 8 heads, SwiGLU 14336, 128k vocabulary,
#      untied, seq 4096) at tp8 and at tp2 x pp2 x dp2 ZeRO-1 (with the balanced split
#      `tessera plan` gives, 17 + 15 layers): tokens/s, MFU, the measured bubble.
# Logs in $OUT; a short table last.
#   bash scripts/gpu-8gpu.sh on a host with 8 GPUs (after scripts/make-dist.sh)
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
ngpu=$(nvidia-smi -L | wc -l)
echo "== $ngpu x $card"
[ "$ngpu" -ge 8 ] || { echo "needs 8 GPUs, $ngpu visible"; exit 2; }
b1=$(timeout 60 dist/bin/nccl_allreduce_baseline 1073741824 2>&1 | tee "$OUT/baseline1.txt" | tail -1)
for lay in tp8 3d; do
  extra=(); [ $lay = 3d ] && extra=(--set 'groups.0.layout={tp: 2, dp: 2, pp: 2}')
  timeout 150 dist/bin/tessera -o json local examples/comm-check-8gpu.yaml --state-dir "/tmp/state-cc-$lay" "${extra[@]}" \
    > "$OUT/comm_check_$lay.json" 2> "$OUT/comm_check_$lay.log"
  echo "comm-check $lay: exit $?"
done
b2=$(timeout 60 dist/bin/nccl_allreduce_baseline 1073741824 2>&1 | tee "$OUT/baseline2.txt" | tail -1)
timeout 200 dist/bin/trainer_gpu_test --gtest_filter='*tp2_pp2_dp2_zero1*:*tp2_sp_cp2_pp2*' > "$OUT/trainer_gpu_test.txt" 2>&1
echo "trainer_gpu_test (8-rank layouts): exit $?"
grep -E "^\[  (FAILED|SKIPPED) |Failure" "$OUT/trainer_gpu_test.txt" | head -10
shape="--hidden 4096 --layers 32 --heads 32 --kv-heads 8 --ffn 14336 --vocab 128256 --tied 0 --seq 4096 --steps 4 --warmup 2"
: > "$OUT/scale.jsonl"
for a in "--tp 8 --micro 4" "--tp 2 --pp 2 --dp 2 --zero 1 --micro 8" "--tp 2 --pp 2 --dp 2 --zero 1 --micro 8 --stage-layers 17,15"; do
  timeout 120 dist/bin/train_bench $shape $a >> "$OUT/scale.jsonl" 2>> "$OUT/scale.err" || echo "train_bench $a: failed"
done
python3 - "$OUT" "$card" "$b1" "$b2" <<'PY'
import json, sys
out, card, b1, b2 = sys.argv[1:]
def bus(line):
    try: return float(line.split()[3])
    except Exception: return float("nan")
base = max(bus(b1), bus(b2))
print(f"\n== comm-check on 8 x {card} (every group's collectives verified)")
for lay in ("tp8", "3d"):
    try:
        job = json.load(open(f"{out}/comm_check_{lay}.json"))
        rows = json.loads(job.get("resultJson", "{}")).get("comm_check", [])
    except Exception as e:
        print(f"{lay}: no result ({e})"); continue
    if job.get("state") != "JOB_STATE_SUCCEEDED":
        print(f"{lay}: {job.get('state')}: {job.get('reason')}"); continue
    print(f"{lay}: {len(rows)} measurements over groups {sorted({r['kind'] for r in rows})}, all verified")
    if lay == "tp8":
        ours = [r["busbw_gbps"] for r in rows if r["collective"] == "all_reduce" and r["size"] == 1 << 30 and r.get("kind") == "tp"]
        if ours:
            print(f"  all-reduce 1 GiB over 8 GPUs: {ours[0]:.1f} GB/s bus bandwidth; plain NCCL loop {bus(b1):.1f} / {bus(b2):.1f}: "
                  f"{ours[0] / base:.3f} of the better")
for l in open(f"{out}/trainer_gpu_test.txt"):
    if l.startswith("RESULT"): print(l.strip()[7:][:240])
print(f"\n== 8B Llama shape, seq 4096, 8 x {card}")
peak = 989 if "H100" in card or "H200" in card else float("nan")
for l in open(f"{out}/scale.jsonl"):
    if not l.startswith("{"): continue
    r = json.loads(l)
    name = f"tp{r['tp']} pp{r.get('pp', 1)} dp{r['dp']} zero{r['zero']} m{r['micro']}" + (" layers " + ",".join(map(str, r["stage_layers"])) if r.get("stage_layers") else "")
    bub = f"bubble {r['bubble']:.3f} (ideal {r['bubble_ideal']:.3f})" if r.get("pp", 1) > 1 else ""
    print(f"{name:40} {r['step_ms']:8.1f} ms/step {r['tokens_per_s']:9.0f} tokens/s {r['tflops_per_gpu']:6.1f} TFLOP/s/GPU "
          f"MFU {r['tflops_per_gpu'] / peak:.1%}  peak {r['peak_gib']:.1f} GiB  {bub}")
PY
