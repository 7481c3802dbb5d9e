#!/usr/bin/env bash
# Where a training step's GPU time goes (dist/ from scripts/make-dist.sh): bench/train_bench
# (the ~1B Llama) with `--trace` — each rank's kernels, copies and memsets from CUPTI
# (bench/cupti_trace.h) — read by bench/nsys_gaps.py: each process's last "timed step",
# its compute-stream gaps, NCCL under compute, compute time by kind, and with WHAT=train
# the kernels ranked by time. (The GPU hosts' Nsight Systems is Nsight Compute's copy,
# whose reports held no CUDA records there; CUPTI is what it would have used.)
#   WHAT=train (default, 1 GPU): one GPU, M micro-batches (default 4), TRAIN_ARGS extra;
#   WHAT=dp (DP GPUs, default 4): alone and at dpDP — what DP's overlap costs;
#   WHAT=decode: Nsight Systems over bench/decode_bench (BATCHES=1), kernels ranked.
# Traces stay in /tmp on the host; the tables go to $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
# libcupti: the toolkit's, else PyTorch's wheel, else the copy make-dist.sh bundled.
cupti=$(ls /usr/local/cuda*/lib64/libcupti.so.13 /usr/local/cuda*/lib/libcupti.so.13 \
  /usr/local/cuda*/extras/CUPTI/lib64/libcupti.so.13 2>/dev/null | head -1)
[ -n "$cupti" ] || cupti=$(python3 -c 'import nvidia.cuda_cupti as m, os; print(os.path.join(list(m.__path__)[0], "lib", "libcupti.so.13"))' 2>/dev/null)
[ -n "$cupti" ] && [ -e "$cupti" ] || cupti=$PWD/dist/prof-lib/libcupti.so.13
echo "libcupti: $cupti"
export LD_LIBRARY_PATH=$(dirname "$cupti"):$LD_LIBRARY_PATH
shape="--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256"
# trace NAME ARGS...: train_bench with the trace into /tmp/NAME.rank<r>.csv.
trace() {
  local name=$1; shift
  rm -f /tmp/"$name".rank*.csv
  dist/bin/train_bench $shape --seq 4096 --steps 2 --warmup 3 --trace "/tmp/$name" "$@" > "$OUT/profile_$name.txt" 2>&1 \
    || { echo "trace $name: train_bench failed:"; tail -3 "$OUT/profile_$name.txt"; return 1; }
  grep -E "^rank [0-9]+: trace" "$OUT/profile_$name.txt" | head -4
  grep -oE '"step_ms": [0-9.]+' "$OUT/profile_$name.txt"
}
case "${WHAT:-train}" in
dp)
  trace alone --micro ${M:-4}
  trace dp${DP:-4} --micro ${M:-4} --dp ${DP:-4}
  python3 bench/nsys_gaps.py /tmp/alone /tmp/dp${DP:-4} --chrome "$OUT/dp.trace.json" | tee "$OUT/gaps.txt" ;;
train)
  trace train --micro ${M:-4} ${TRAIN_ARGS:-}
  python3 bench/nsys_gaps.py /tmp/train --kernels ${KERNELS:-30} --chrome "$OUT/train.trace.json" | tee "$OUT/kernels.txt" ;;
decode)  # Nsight Systems (CUDA graphs traced per node; its .qdstrm importer needs libdw). The
  # GPU hosts' copy recorded no CUDA work for train_bench: unverified there.
  nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys \
    /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2>/dev/null | head -1)
  importer=$(ls /opt/nvidia/nsight-*/*/host/*/QdstrmImporter 2>/dev/null | head -1)
  [ -n "$nsys" ] || { echo "nsys: not found"; exit 1; }
  export LD_LIBRARY_PATH=$PWD/dist/prof-lib:$LD_LIBRARY_PATH
  "$nsys" profile -o /tmp/decode --force-overwrite true --trace cuda,nvtx --cuda-graph-trace=node \
    dist/bin/decode_bench $shape --batch ${BATCHES:-1} --prompt 128 --new 128 --reps 1 > "$OUT/profile_decode.txt" 2>&1
  [ -f /tmp/decode.nsys-rep ] || "$importer" -i /tmp/decode.qdstrm >> "$OUT/profile_decode.txt" 2>&1
  "$nsys" stats --report cuda_gpu_kern_sum --format csv /tmp/decode.nsys-rep 2> /dev/null | tail -n +2 | head -30 | tee "$OUT/kernels.txt" ;;
esac
