#!/usr/bin/env bash
# A/B of the ~1B Llama training step on one GPU: the baseline's train_bench
# (.carry/base.tar.xz from scripts/make-base.sh) against this build's (dist/, make-dist.sh),
# in alternating rounds on the same card, so that drift between rounds shows.
#   AB_ARGS    train_bench arguments after the 1B shape (default "--micro 4")
#   ROUNDS     rounds of (base, new) (default 2)
#   AB_ATTN=1  also op_bench's attention cases, both builds
#   AB_TUNE=1  also this build with --gemm-tune 1 in every round ("tune"), and op_bench's
#              gemm_train cases without and with TESSERA_GEMM_TUNE=1
#   AB_SIDES   instead of base / dist (/ tune): a round's sides, ';'-separated, each
#              "label=DIR extra train_bench args" (DIR: base or dist), e.g.
#              'inline=dist --overlap-update 0;beside=dist' (no baseline pack needed)
#   AB_PEER=1  also the PyTorch peer in every round (bench/llama_train_peer.py,
#              torch.compile + SDPA cuDNN, fused AdamW: "torch")
# A short table is printed last; logs go to $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
shape="--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256 --seq 4096"
args=${AB_ARGS:---micro 4}
if [ -n "${AB_SIDES:-}" ]; then
  IFS=';' read -ra sides <<< "$AB_SIDES"
else
  [ -f .carry/base.tar.xz ] || { echo "gpu-ab: no .carry/base.tar.xz (scripts/make-base.sh)"; exit 1; }
  sides=("base=base" "dist=dist")
  [ "${AB_TUNE:-0}" = 1 ] && sides+=("tune=dist --gemm-tune 1")
fi
if printf '%s\n' "${sides[@]}" | grep -q '=base'; then rm -rf base && tar -xJf .carry/base.tar.xz || exit 3; fi
rows=()
for r in $(seq 1 "${ROUNDS:-2}"); do
  for spec in "${sides[@]}"; do
    side=${spec%%=*} rest=${spec#*=}
    bin=${rest%% *} extra=""
    [ "$bin" != "$rest" ] && extra=${rest#* }
    log="$OUT/ab_${side}_$r.jsonl"
    $bin/bin/train_bench $shape $args $extra --steps 6 --warmup 3 > "$log" 2> "$OUT/ab_${side}_$r.err" || { echo "$side round $r failed:"; tail -3 "$OUT/ab_${side}_$r.err"; }
    ms=$(grep -oE '"step_ms": [0-9.]+' "$log" | tail -1 | awk '{print $2}')
    mfu=$(python3 -c "import json,sys; r=[json.loads(l) for l in open('$log') if l.startswith('{')][-1]; print(f\"{r['tflops']/989:.1%} {r['peak_gib']:.2f}\")" 2>/dev/null)
    rows+=("$side $r ${ms:-?} ${mfu:-? ?}")
  done
  if [ "${AB_PEER:-0}" = 1 ]; then
    log="$OUT/ab_torch_$r.jsonl"
    python3 bench/llama_train_peer.py $shape $args --steps 6 --warmup 3 --variants compile+CUDNN_ATTENTION > "$log" 2> "$OUT/ab_torch_$r.err" || { echo "torch round $r failed:"; grep -v Warning "$OUT/ab_torch_$r.err" | tail -3; }
    row=$(python3 -c "import json; r=[json.loads(l) for l in open('$log') if l.startswith('{')][-1]; print(f\"{r['step_ms']:.2f} {r['tflops']/989:.1%} {r['peak_gib']:.2f}\")" 2>/dev/null)
    rows+=("torch $r ${row:-? ? ?}")
  fi
done
# op_bench lines of two runs side by side: ms (and the ratio) per case of the second run.
compare() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def rows(f):
    return {r["op"]: r for r in (json.loads(l) for l in open(f) if l.startswith("{"))}
a, b = rows(sys.argv[1]), rows(sys.argv[2])
for op in b:
    if op in a:
        print(f"{op:32} {a[op]['ms']:8.4f} -> {b[op]['ms']:8.4f}  ({a[op]['ms'] / b[op]['ms']:.3f}x)")
    else:
        print(f"{op:32} {'-':>8} -> {b[op]['ms']:8.4f}")
PY
}
if [ "${AB_ATTN:-0}" = 1 ]; then
  for side in base dist; do $side/bin/op_bench attn > "$OUT/ab_attn_$side.txt" 2>&1; done
  echo "== attention (op_bench attn), $card: ms base -> new"
  compare "$OUT/ab_attn_base.txt" "$OUT/ab_attn_dist.txt"
fi
if [ "${AB_TUNE:-0}" = 1 ]; then
  dist/bin/op_bench gemm_train > "$OUT/ab_gemm_heur.txt" 2>&1
  TESSERA_GEMM_TUNE=1 dist/bin/op_bench gemm_train > "$OUT/ab_gemm_tune.txt" 2>&1
  echo "== GEMMs (op_bench gemm_train: the 1B micro-batch's fwd/dgrad/wgrad), $card: ms heuristic -> tuned"
  compare "$OUT/ab_gemm_heur.txt" "$OUT/ab_gemm_tune.txt"
fi
echo "== ~1B Llama, $card, train_bench $args${AB_SIDES:+ — sides: $AB_SIDES}$([ -f base/NAME ] && echo " — base: $(cat base/NAME)")"
printf '%-6s %-5s %9s %8s %8s\n' build round "step ms" MFU "peak GiB"
for row in "${rows[@]}"; do set -- $row; printf '%-6s %-5s %9s %8s %8s\n' "$1" "$2" "$3" "$4" "$5"; done
