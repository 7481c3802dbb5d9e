#!/usr/bin/env bash
# Where a generation's GPU time goes, per decode-bench shape: dist/bin/decode_bench with
# --trace (CUPTI) for each batch size, then bench/nsys_gaps.py's summary of the traced
# Generate() (its kernels by total time, the idle gaps between them). Over the installed
# tree (scripts/gpu-env.sh); the traces stay in $TRACE_DIR (default /tmp), the summaries
# print.
#   bash bench/decode_breakdown.sh NAME "SHAPE ARGS" [BATCHES] [TOP]
set -uo pipefail
source "$(dirname "$0")/../scripts/gpu-env.sh"
name=$1 shape=$2 batches=${3:-1,64,256} top=${4:-25}
dir=${TRACE_DIR:-/tmp}
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$PWD/dist/prof-lib
dist/bin/decode_bench $shape --batch "$batches" --trace "$dir/$name" --hbm-gbps "${HBM_GBPS:-4300}" || exit 1
for b in ${batches//,/ }; do
  echo "== $name batch $b"
  python3 bench/nsys_gaps.py "$dir/$name.b$b.csv" --kernels "$top" --gaps 5
done
