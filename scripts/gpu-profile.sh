#!/usr/bin/env bash
# Where a training step's GPU time goes (one GPU, dist/ from scripts/make-dist.sh): Nsight
# Systems over bench/train_bench (the ~1B Llama, 2 timed steps) — or, WHAT=decode, over
# bench/decode_bench (BATCHES=1: warm-up + 1 full + 1 one-token run) —, then the kernels
# ranked by total time. Prints the table; the report stays in $OUT. WHAT=dp (4 GPUs):
# train_bench alone and at dp4 (M micro-batches, default 4), then bench/nsys_gaps.py on
# both — each rank's last timed step: compute-stream idle gaps, NCCL time under compute,
# compute kernel time by kind (what DP's overlap costs).
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
[ -n "$nsys" ] || { echo "nsys: not found"; exit 1; }
shape="--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256"
if [ "${WHAT:-train}" = dp ]; then  # DP's cost, one GPU alone against dp4 (a process per rank: fork traced)
  for run in alone dp4; do
    extra=""; [ $run = dp4 ] && extra="--dp 4"
    "$nsys" profile -o "/tmp/$run" --force-overwrite true --trace cuda,nvtx --trace-fork-before-exec=true \
      dist/bin/train_bench $shape --seq 4096 --micro ${M:-4} --steps 2 --warmup 3 $extra > "$OUT/profile_$run.txt" 2>&1
    tail -1 "$OUT/profile_$run.txt"
    "$nsys" export --type sqlite --force-overwrite true -o "/tmp/$run.sqlite" "/tmp/$run.nsys-rep" > /dev/null 2>&1
  done
  python3 bench/nsys_gaps.py /tmp/alone.sqlite /tmp/dp4.sqlite | tee "$OUT/gaps.txt"
  exit 0
elif [ "${WHAT:-train}" = decode ]; then  # the rollout engine's decode (CUDA graphs traced per node)
  "$nsys" profile -o "$OUT/train" --force-overwrite true --trace cuda,nvtx --cuda-graph-trace=node \
    dist/bin/decode_bench $shape --batch ${BATCHES:-1} --prompt 128 --new 128 --reps 1 > "$OUT/profile_run.txt" 2>&1
else
  "$nsys" profile -o "$OUT/train" --force-overwrite true --trace cuda,nvtx dist/bin/train_bench $shape --seq 4096 --micro 4 \
    --steps 2 --warmup 2 > "$OUT/profile_run.txt" 2>&1
fi
tail -2 "$OUT/profile_run.txt"
"$nsys" stats --report cuda_gpu_kern_sum --format csv "$OUT/train.nsys-rep" > "$OUT/kern.csv" 2> /dev/null
python3 - "$OUT/kern.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
hdr = next(i for i, r in enumerate(rows) if r and r[0].startswith("Time"))
head, data = rows[hdr], rows[hdr + 1:]
ti, tot, inst, name = head.index("Time (%)"), head.index("Total Time (ns)"), head.index("Instances"), head.index("Name")
total = sum(float(r[tot]) for r in data)
print(f"GPU kernel time of the profiled run: {total/1e6:.1f} ms")
for r in data[:25]:
    print(f"{float(r[ti]):5.1f}% {float(r[tot])/1e6:9.1f} ms {int(r[inst]):6d}x  {r[name][:110]}")
PY
