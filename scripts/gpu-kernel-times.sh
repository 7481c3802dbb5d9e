#!/usr/bin/env bash
# Where a training step's GPU time goes, without Nsight Systems (absent on the GPU
# hosts): Nsight Compute times every kernel of one bench/train_bench step (the ~1B Llama,
# one 4096-token micro-batch, no warm-up) with the single metric gpu__time_duration, and
# the kernels are summed by name. Kernels run serialized under ncu, so the total is GPU
# busy time, not the step's wall time. Prints the top kernels; the CSV stays in $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "ncu: not found"; exit 1; }
shape="--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256 --seq 4096 --micro 1"
"$ncu" --metrics gpu__time_duration.sum --csv --print-units base \
  dist/bin/train_bench $shape --steps 1 --warmup 0 > "$OUT/kernels.csv" 2> "$OUT/ncu.err"
echo "ncu exit $?"; tail -2 "$OUT/ncu.err"
python3 - "$OUT/kernels.csv" <<'PY'
import csv, collections, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, data = rows[0], rows[1:]
k, v = head.index("Kernel Name"), head.index("Metric Value")
by = collections.defaultdict(lambda: [0.0, 0])
for r in data:
    try:
        by[r[k]][0] += float(r[v]); by[r[k]][1] += 1
    except ValueError:
        pass
total = sum(t for t, _ in by.values())
print(f"{len(data)} kernels, {total/1e6:.1f} ms GPU time (init + 1 step of 1 micro-batch + optimizer)")
for name, (t, n) in sorted(by.items(), key=lambda x: -x[1][0])[:30]:
    print(f"{100*t/total:5.1f}% {t/1e6:8.2f} ms {n:5d}x  {name[:100]}")
PY
