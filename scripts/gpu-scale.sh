#!/usr/bin/env bash
# Multi-GPU training throughput on one host (dist/ from scripts/make-dist.sh), one
# run: bench/train_bench for 1 GPU and the engine's layouts (DP 2 and 4, ZeRO-1/3,
# TP 2 with SP, TP 2 x DP 2), and the PyTorch peers (bench/llama_train_peer.py: one GPU,
# DDP on 2 and 4 GPUs, FSDP2 on 2) under torchrun, same model and tokens per GPU.
# Prints a table with weak-scaling efficiency (tokens/s per GPU against one GPU).
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
ngpu=$(nvidia-smi -L | wc -l)
shape="--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256 --seq 4096 --micro 4 --steps 6 --warmup 3"
: > "$OUT/scale.jsonl"
run() { timeout 300 dist/bin/train_bench $shape "$@" >> "$OUT/scale.jsonl" 2>> "$OUT/scale.err" || echo "train_bench $*: failed" >&2; }
run
run --dp 2
run --dp 2 --zero 1
run --dp 2 --zero 3
run --tp 2 --sp 1
[ "$ngpu" -ge 4 ] && { run --dp 4; run --dp 4 --zero 1; run --tp 2 --dp 2 --zero 1 --sp 1; }
# Pipelines (PP=2): the measured bubble against (pp - 1) / (vpp * micro-batches).
if [ "${PIPELINES:-1}" = 1 ]; then
  run --pp 2
  run --pp 2 --schedule gpipe
  run --pp 2 --vpp 2
  run --pp 2 --micro 8
  run --pp 2 --vpp 2 --micro 8
fi
peer() { timeout 300 torchrun --standalone --nproc_per_node "$1" bench/llama_train_peer.py $shape \
  --variants compile+CUDNN_ATTENTION --parallel "$2" >> "$OUT/scale.jsonl" 2>> "$OUT/scale_torch.err" || echo "peer $*: failed" >&2; }
timeout 300 python3 bench/llama_train_peer.py $shape --variants compile+CUDNN_ATTENTION >> "$OUT/scale.jsonl" 2>> "$OUT/scale_torch.err"
peer 2 ddp
peer 2 fsdp2
[ "$ngpu" -ge 4 ] && peer 4 ddp
tail -3 "$OUT/scale.err" 2>/dev/null
python3 - "$OUT/scale.jsonl" "$card" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(f"\n== ~1B Llama, seq 4096, 4 micro-batches per DP rank per step, {sys.argv[2]}")
print(f"{'run':34} {'gpus':>4} {'step ms':>8} {'tokens/s':>9} {'TFLOP/s/GPU':>11} {'MFU(989)':>8} {'weak eff':>8} {'peak GiB':>8}")
base = {}
bubbles = []
for r in rows:
    if "error" in r:
        print(f"{r['impl'] + ' ' + r['variant']:34} error: {r['error'][:90]}"); continue
    if r["impl"] == "tessera":
        gpus = r["tp"] * r["dp"] * r.get("pp", 1)
        name = f"tessera tp{r['tp']} dp{r['dp']} zero{r['zero']}" + (" sp" if r["sp"] else "")
        if r.get("pp", 1) > 1:
            name = f"tessera pp{r['pp']} vpp{r['vpp']} {r['schedule']} m{r['micro']}"
            bubbles.append(f"{name}: bubble {r['bubble']:.3f} (ideal {r['bubble_ideal']:.3f}), {r['step_ms']:.1f} ms/step")
        key = "tessera"
    else:
        v = r["variant"]
        gpus = int(v.split("x")[-1]) if " " in v else 1
        name = "torch " + v
        key = "torch"
    per_gpu = r["tokens_per_s"] / gpus
    if gpus == 1: base[key] = per_gpu
    eff = per_gpu / base[key] if key in base else float("nan")
    tf = r.get("tflops_per_gpu", r["tflops"] / gpus)
    print(f"{name:34} {gpus:>4} {r['step_ms']:>8.1f} {r['tokens_per_s']:>9.0f} {tf:>11.1f} {tf/989:>8.1%} {eff:>8.1%} {r['peak_gib']:>8.1f}")
print("\n".join(["", "pipelines (measured bubble = slowest stage's step / mean compute - 1):"] + bubbles) if bubbles else "")
PY
