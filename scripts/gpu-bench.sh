#!/usr/bin/env bash
# Op benchmarks on a GPU: Tessera's CUDA ops (bench/op_bench) and the PyTorch
# peer (bench/torch_ops_peer.py) in the same call; prints a side-by-side table.
# ONLY=attn: attention only (both sides).
set -uo pipefail
GPU_ENV_KEEP_DIST=1 source "$(dirname "$0")/gpu-env.sh"
only="${ONLY:-}" peer_args=()
[ "$only" = attn ] && peer_args=(--attention-only)
dist/bin/op_bench $only > "$OUT/op_bench.jsonl" 2> "$OUT/op_bench.err"
python3 bench/torch_ops_peer.py "${peer_args[@]}" > "$OUT/torch_peer.jsonl" 2> "$OUT/torch_peer.err"
# Kernel-variant sweeps, when bench/variants/build.sh put them into dist/bin.
for v in rope_variants rmsnorm_bwd_variants; do
  [ -x "dist/bin/$v" ] && "dist/bin/$v" > "$OUT/$v.txt" 2>&1
done
python3 - "$OUT/op_bench.jsonl" "$OUT/torch_peer.jsonl" "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" <<'PY'
import json, sys
ours = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
peer = [p for p in (json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")) if "op" in p]
copy = next((p["gbps"] for p in peer if p["op"] == "device_copy"), float("nan"))
print(f"\n== op benchmarks on {sys.argv[3]} (device copy {copy:.0f} GB/s, bf16 GEMM ceiling ~790 TFLOP/s)")
print(f"{'op':22} {'tessera ms':>10} {'value':>10} {'best peer':>22} {'peer ms':>9} {'ratio':>6} {'of limit':>8}")
for o in ours:
    cands = [p for p in peer if p["op"] == o["op"]]
    best = min(cands, key=lambda p: p["ms"]) if cands else None
    unit = "gbps" if "gbps" in o else "tflops"
    limit = copy if unit == "gbps" else 790.0
    ratio = best["ms"] / o["ms"] if best else float("nan")
    print(f"{o['op']:22} {o['ms']:>10.3f} {o[unit]:>7.0f} {unit[:2]} {(best['variant'] if best else '-'):>22} "
          f"{(best['ms'] if best else float('nan')):>9.3f} {ratio:>6.2f} {o[unit]/limit:>8.0%}")
attn = sorted({p["op"] for p in peer if p["op"].startswith("attn")})
if attn:
    print("\nattention peers (ms): " + "  ".join(f"{b:>9}" for b in ("FLASH", "CUDNN", "EFFICIENT")) + "   tessera")
    for op in attn:
        ms = {p["variant"]: p["ms"] for p in peer if p["op"] == op}
        mine = next((o["ms"] for o in ours if o["op"] == op), float("nan"))
        print(f"{op:22} " + "  ".join(f"{ms.get(b, float('nan')):>9.3f}" for b in ("FLASH", "CUDNN", "EFFICIENT")) + f"   {mine:>7.3f}")
PY
