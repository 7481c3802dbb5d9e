#!/usr/bin/env bash
# The controller and the `tessera` CLI run in the controller's image, which has no CUDA:
# neither may need a CUDA, NCCL or Gloo library at load time (readelf's NEEDED entries;
# the agent that `tessera local` embeds finds GPUs through the driver, loaded with dlopen).
#   check_binary_deps.sh BIN_DIR
set -uo pipefail
bin=${1:?usage: check_binary_deps.sh BIN_DIR}
command -v readelf > /dev/null || { echo "FAIL: readelf not found (binutils)"; exit 1; }
bad=0
for b in tessera tessera-controller; do
  [ -x "$bin/$b" ] || { echo "FAIL: $bin/$b is not built"; bad=1; continue; }
  needed=$(readelf -d "$bin/$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  [ -n "$needed" ] || { echo "FAIL: $b: readelf shows no NEEDED entries"; bad=1; continue; }
  while IFS= read -r lib; do
    case $lib in
      libcuda.so*|libcudart*|libnccl*|libcublas*|libcudnn*|libnvrtc*|libgloo*|libopenblas*)
        echo "FAIL: $b needs $lib"; bad=1 ;;
    esac
  done <<< "$needed"
done
[ $bad = 0 ] && echo "check_binary_deps: tessera and tessera-controller need no CUDA, NCCL, Gloo or BLAS library"
exit $bad
