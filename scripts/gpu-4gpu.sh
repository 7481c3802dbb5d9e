#!/usr/bin/env bash
# The four-GPU checks in one run (dist/ from scripts/make-dist.sh), on a 4-GPU host:
#   1. trainer_gpu_test: every oracle layout, those of 4 ranks included (pp4 vpp2 1F1B and
#      GPipe with tied embeddings, tp2 pp2, pp2 dp2 ZeRO-1, tp2 dp2, tp2 cp2 ...);
#   2. train_bench (~1B Llama, seq 4096, 4 micro-batches per DP rank): 1 GPU, dp2 and dp4
#      (DP weak scaling), and pp4 with 8 micro-batches, vpp 1 and 2 (the measured bubble).
# Logs in $OUT; a short table last. Ranks are processes (as executors): the whole oracle
# takes ~9 minutes on 4 GPUs, so a run does either the oracle (SKIP_BENCH=1, or a subset
# with ORACLE_FILTER) or the benchmarks (SKIP_ORACLE=1), within the 10-minute call limit.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
ngpu=$(nvidia-smi -L | wc -l)
echo "== $ngpu x $card"
: > "$OUT/trainer_gpu_test.txt"
if [ "${SKIP_ORACLE:-0}" != 1 ]; then
  timeout ${ORACLE_TIMEOUT:-540} dist/bin/trainer_gpu_test ${ORACLE_FILTER:+--gtest_filter=$ORACLE_FILTER} > "$OUT/trainer_gpu_test.txt" 2>&1
  echo "trainer_gpu_test: exit $?"
  grep -E "^\[  (FAILED|SKIPPED) |Failure|failed \(|still running" "$OUT/trainer_gpu_test.txt" | head -20
  grep -cE "^\[       OK \]" "$OUT/trainer_gpu_test.txt" | sed 's/^/layouts passed: /'
fi
shape="--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256 --seq 4096 --steps 6 --warmup 3"
: > "$OUT/scale.jsonl"
runs=()
[ "${SKIP_BENCH:-0}" != 1 ] && IFS=';' read -ra runs <<< "${BENCH_RUNS:---micro 4;--micro 4 --dp 2;--micro 4 --dp 4;--micro 8 --pp 4;--micro 8 --pp 4 --vpp 2}"
for a in "${runs[@]+"${runs[@]}"}"; do  # a run may start with NCCL settings: "NCCL_MAX_CTAS=8 --micro 4 --dp 4"
  env_part=$(grep -oE '^([A-Z_]+=[^ ]+ )+' <<< "$a"); args=${a#"$env_part"}
  env $env_part timeout 150 dist/bin/train_bench $shape $args | sed "s/^{/{\"env\": \"${env_part% }\", /" >> "$OUT/scale.jsonl" 2>> "$OUT/scale.err" || echo "train_bench $a: failed"
done
python3 - "$OUT" "$card" <<'PY'
import json, sys
out, card = sys.argv[1:]
print(f"\n== oracle layouts on GPUs ({card}): largest relative differences")
for line in open(f"{out}/trainer_gpu_test.txt"):
    if line.startswith("RESULT"):
        print(line.strip()[7:][:260])
rows = [json.loads(l) for l in open(f"{out}/scale.jsonl") if l.startswith("{")]
print(f"\n== ~1B Llama, seq 4096, {card}")
base = None
for r in rows:
    gpus = r["tp"] * r["dp"] * r.get("pp", 1)
    per = r["tokens_per_s"] / gpus
    if gpus == 1: base = per  # each 1-GPU run is the base of the runs after it
    name = f"tp{r['tp']} dp{r['dp']} pp{r.get('pp', 1)} vpp{r.get('vpp', 1)} m{r.get('micro')}" + (f" zero{r['zero']}" if r.get("zero") else "")
    extra = f"  bubble {r['bubble']:.3f} (ideal {r['bubble_ideal']:.3f})" if r.get("pp", 1) > 1 else f"  dp wait {r.get('dp_wait_ms', 0):.2f} ms, enqueue {r.get('dp_enqueue_ms', 0):.2f} ms + host ops {r.get('dp_host_ops_ms', 0):.2f} ms / {r.get('dp_calls', 0):.0f} calls"
    if r.get("last_stage_layers"): name += f" last {r['last_stage_layers']}"
    if r.get("stage_layers"): name += " layers " + ",".join(map(str, r["stage_layers"]))
    if r.get("early_embedding") == 0: name += " early-embedding 0"
    if r.get("comm_priority") == "high": name += " comm-priority high"
    if r.get("nccl_blocking") == 0: name += " nccl-nonblocking"
    if r.get("grad_reduce") == "bf16": name += " grad-reduce bf16"
    if r.get("group_reductions") == 0: name += " ungrouped"
    if r.get("env"): name = r["env"] + " " + name
    eff = f"{per / base:.1%}" if base and r.get("pp", 1) == 1 else ""
    print(f"{name:58} gpus {gpus}  {r['step_ms']:8.1f} ms/step  {r['tokens_per_s']:9.0f} tokens/s  weak eff {eff:>6}{extra}")
PY
