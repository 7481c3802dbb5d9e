#!/usr/bin/env bash
# The training engine on a GPU host (dist/ from scripts/make-dist.sh), one run:
#   1. llama_cuda_test (one GPU, f32 and mixed precision against the CPU oracle) and the
#      CUDA GEMM cases of the op harness (bf16 -> f32 included);
#   2. trainer_gpu_test: the oracle layouts on 2 and 4 GPUs (NCCL), f32 and bf16;
#   3. train_bench (a ~1B Llama, one GPU, bf16) and its PyTorch peer
#      (bench/llama_train_peer.py) in the same call.
# Logs go to $OUT; a short table is printed last.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
ngpu=$(nvidia-smi -L | wc -l)
echo "== $ngpu x $card"
dist/bin/op_test --gtest_filter='*Gemm*' > "$OUT/op_test_gemm.txt" 2>&1; echo "op_test Gemm: exit $?"
dist/bin/llama_cuda_test > "$OUT/llama_cuda_test.txt" 2>&1; echo "llama_cuda_test: exit $?"
grep -E "Failure|FAILED" "$OUT/llama_cuda_test.txt" | head -5
timeout 300 dist/bin/trainer_gpu_test > "$OUT/trainer_gpu_test.txt" 2>&1; echo "trainer_gpu_test: exit $?"
grep -E "^\[  (FAILED|SKIPPED) |Failure" "$OUT/trainer_gpu_test.txt" | head -20
[ "${SKIP_BENCH:-0}" = 1 ] && { grep RESULT "$OUT/trainer_gpu_test.txt" | cut -c8-; exit 0; }
# ~1B Llama (Llama 3.2 1B shape: hidden 2048, 16 layers, 32/8 heads, ffn 8192, 128k vocab, tied), seq 4096.
shape="--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256 --seq 4096 --micro 4"
dist/bin/train_bench $shape --steps 8 --warmup 3 > "$OUT/train_bench.jsonl" 2> "$OUT/train_bench.err"
echo "train_bench: exit $?"; tail -3 "$OUT/train_bench.err"
python3 bench/llama_train_peer.py $shape --steps 8 --warmup 3 > "$OUT/torch_train.jsonl" 2> "$OUT/torch_train.err"
echo "peer: exit $?"; grep -v Warning "$OUT/torch_train.err" | tail -3
python3 - "$OUT" "$card" <<'PY'
import json, re, sys, glob
out, card = sys.argv[1:]
print(f"\n== training oracle on GPUs ({card}): largest relative differences")
for line in open(f"{out}/trainer_gpu_test.txt"):
    if line.startswith("RESULT"):
        print(line.strip()[7:])
rows = []
for f in ("train_bench.jsonl", "torch_train.jsonl"):
    try:
        rows += [json.loads(l) for l in open(f"{out}/{f}") if l.startswith("{")]
    except FileNotFoundError:
        pass
print(f"\n== ~1B Llama, seq 4096, 4 micro-batches/step, one {card}")
print(f"{'impl':28} {'step ms':>8} {'tokens/s':>9} {'TFLOP/s':>8} {'MFU(989)':>8} {'of 790':>7} {'peak GiB':>8}")
ours = next((r for r in rows if r.get("impl") == "tessera"), None)
for r in rows:
    if "error" in r:
        print(f"{r['impl'] + ' ' + r.get('variant', ''):28} error: {r['error'][:80]}"); continue
    name = r["impl"] + (" " + r["variant"] if "variant" in r else " " + r.get("dtype", ""))
    print(f"{name:28} {r['step_ms']:>8.1f} {r['tokens_per_s']:>9.0f} {r['tflops']:>8.1f} {r['tflops']/989:>8.1%} "
          f"{r['tflops']/790:>7.1%} {r['peak_gib']:>8.1f}")
peers = [r for r in rows if r.get("impl") == "torch" and "error" not in r]
if ours and peers:
    best = max(peers, key=lambda r: r["tokens_per_s"])
    print(f"tessera / best peer ({best['variant']}): {ours['tokens_per_s'] / best['tokens_per_s']:.2f}x")
    print("losses tessera:", ours["losses"][:4], " peer:", best["losses"][:4])
PY
