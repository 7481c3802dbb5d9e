#!/usr/bin/env bash
# Builds the kernel-variant sweeps (bench/variants/*.cu) into $1 (default dist/bin) with
# nvcc, for a run on a GPU next to the op benchmarks. Each variant is the kernel's
# own source compiled with its tuning macros set and its launcher renamed, so the sweep
# times exactly the code the library would run with those settings.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-dist/bin}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
NV="${NVCC:-/usr/local/cuda/bin/nvcc} -std=c++17 -O3 -I. --generate-code=arch=compute_90a,code=sm_90a"
ABSL="-labsl_status -labsl_strings -labsl_strings_internal -labsl_raw_logging_internal -labsl_int128 -labsl_cord
      -labsl_cordz_info -labsl_cord_internal -labsl_cordz_functions -labsl_cordz_handle -labsl_synchronization
      -labsl_time -labsl_base -labsl_throw_delegate -labsl_str_format_internal"
for v in "2 128" "4 128" "8 128" "4 256" "8 256" "16 128"; do
  set -- $v
  $NV -DTESSERA_ROPE_HEADS=$1 -DTESSERA_ROPE_BLOCK=$2 -DRopeCuda=Rope_h$1_b$2 -c kernels/rope/rope_cuda.cu -o "$tmp/rope_h$1_b$2.o" &
done
RMS_VARIANTS="0_32_8_1 1_32_8_1 0_16_8_1 1_16_8_1 1_32_6_1 1_32_12_1"
for v in $RMS_VARIANTS; do
  IFS=_ read -r p r w b <<< "$v"
  $NV -DTESSERA_RMS_BWD_PDL=$p -DTESSERA_RMS_BWD_RCOLS=$r -DTESSERA_RMS_BWD_WARPS=$w -DTESSERA_RMS_BWD_BUFS=$b -DRmsNormBackwardCuda=RmsBwd_p$v \
    -DRmsNormForwardCuda=RmsFwd_p$v -c kernels/rmsnorm/rmsnorm_cuda.cu -o "$tmp/rms_p$v.o" &
done
wait
mkdir -p "$out"
$NV bench/variants/rope_variants.cu "$tmp"/rope_*.o -o "$out/rope_variants" $ABSL
decl=$(for v in $RMS_VARIANTS; do printf 'X(p%s) ' "$v"; done)
$NV "-DRMS_VARIANTS=$decl" bench/variants/rmsnorm_bwd_variants.cu "$tmp"/rms_*.o -o "$out/rmsnorm_bwd_variants" $ABSL
