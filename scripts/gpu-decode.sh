#!/usr/bin/env bash
# The rollout engine on a GPU host (dist/ from scripts/make-dist.sh), one run:
#   1. rollout_gpu_test: the rollout against the training engine (f32 greedy = argmax,
#      sampled log-probs; bf16 mean |difference|), device sampling = host sampling;
#   2. decode_bench (~1B Llama, bf16, batch 1 and 64, 128 + 128 tokens) and its peer,
#      transformers' generate eager and static cache + torch.compile (bench/decode_peer.py);
#   3. grpo_arithmetic on the GPU (the demo's recipe on 3-digit problems, a larger model):
#      held-out accuracy, and a GRPO step's phase times (generate, ref, old, update).
# Logs go to $OUT; a short table is printed last.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$card" in *H200*) hbm=4300 ;; *) hbm=3000 ;; esac  # measured HBM copy, GB/s (docs/perf.md)
echo "== $card (roofline at $hbm GB/s)"
timeout 300 dist/bin/rollout_gpu_test > "$OUT/rollout_gpu_test.txt" 2>&1; echo "rollout_gpu_test: exit $?"
grep -E "^\[  (FAILED|SKIPPED) |Failure|RESULT" "$OUT/rollout_gpu_test.txt" | head -20
shape="--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256"
timeout 300 dist/bin/decode_bench $shape --batch ${BATCHES:-1,64} --prompt 128 --new 128 --reps 3 --hbm-gbps $hbm \
  > "$OUT/decode_bench.jsonl" 2> "$OUT/decode_bench.err"; echo "decode_bench: exit $?"; tail -3 "$OUT/decode_bench.err"
timeout 300 dist/bin/decode_bench $shape --batch ${BATCHES:-1,64} --prompt 128 --new 128 --reps 3 --hbm-gbps $hbm --graphs 0 \
  >> "$OUT/decode_bench.jsonl" 2>> "$OUT/decode_bench.err"; echo "decode_bench (no graphs): exit $?"
timeout 400 python3 bench/decode_peer.py $shape --batch ${BATCHES:-1,64} --prompt 128 --new 128 --reps 3 \
  > "$OUT/decode_peer.jsonl" 2> "$OUT/decode_peer.err"; echo "decode_peer: exit $?"
grep -vi warn "$OUT/decode_peer.err" | tail -3
if [ "${GRPO:-1}" = 1 ]; then
  timeout 240 dist/bin/grpo_arithmetic --device cuda --digits 3 --hidden 256 --layers 6 --sft-steps 2000 --grpo-steps 60 \
    --group 16 --prompts 64 --lr 1e-4 --warmup 5 --kl 0.001 --careless 0.6 --eval 500 > "$OUT/grpo_gpu.jsonl" 2> "$OUT/grpo_gpu.err"
  echo "grpo_arithmetic (cuda): exit $?"; tail -2 "$OUT/grpo_gpu.err"
fi
python3 - "$OUT" "$card" "$hbm" <<'PY'
import json, sys
out, card, hbm = sys.argv[1:]
rows = []
for f in ("decode_bench.jsonl", "decode_peer.jsonl"):
    try:
        rows += [json.loads(l) for l in open(f"{out}/{f}") if l.startswith("{")]
    except FileNotFoundError:
        pass
print(f"\n== decode, ~1B Llama (bf16), prompt 128 + 128 new tokens, greedy, one {card}")
print(f"{'engine':24} {'batch':>5} {'tokens/s':>9} {'prefill ms':>10} {'step ms':>8} {'decode tok/s':>12} {'of roofline':>11} graph steps")
roof = {r["batch"]: r["roofline_ms"] for r in rows if "roofline_ms" in r}
for r in sorted(rows, key=lambda r: (r.get("batch", 0), r["engine"])):
    if "error" in r:
        print(f"{r['engine']:24} {r['batch']:>5} error: {r['error'][:80]}")
        continue
    frac = roof.get(r["batch"], 0) / r["decode_ms_per_step"] if r["decode_ms_per_step"] > 0 else 0
    print(f"{r['engine']:24} {r['batch']:>5} {r['tokens_per_s']:>9.1f} {r['prefill_ms']:>10.2f} {r['decode_ms_per_step']:>8.3f} "
          f"{r['decode_tokens_per_s']:>12.1f} {frac:>11.1%} {r.get('graph_steps', '')}")
for b in sorted(roof):
    t = {r["engine"]: r for r in rows if r.get("batch") == b and "error" not in r}
    if "tessera" in t:
        for peer in ("tessera-no-graphs", "transformers-eager", "transformers-compiled"):
            if peer in t:
                print(f"batch {b}: tessera / {peer}: {t['tessera']['tokens_per_s'] / t[peer]['tokens_per_s']:.2f}x end to end, "
                      f"{t['tessera']['decode_tokens_per_s'] / t[peer]['decode_tokens_per_s']:.2f}x decode")
try:
    g = [json.loads(l) for l in open(f"{out}/grpo_gpu.jsonl") if l.startswith("{")]
    steps = [r for r in g if r.get("phase") == "grpo"]
    if steps:
        print(f"\n== GRPO step phases on one {card} (3-digit arithmetic, careless teacher, hidden 256, 6 layers, 64 prompts x 16)")
        keys = ("generate_s", "ref_s", "old_s", "update_s")
        mean = {k: sum(r.get(k, 0) for r in steps[1:]) / max(1, len(steps) - 1) for k in keys}
        print("  ".join(f"{k} {v:.3f}" for k, v in mean.items()), f" (mean of steps 2-{len(steps)})")
        evals = [r for r in g if "accuracy" in r]
        print("accuracy:", [(r["phase"], r["step"], r["accuracy"]) for r in evals])
except FileNotFoundError:
    pass
PY
