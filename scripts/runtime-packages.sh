#!/usr/bin/env bash
# Prints the Debian/Ubuntu packages that hold the shared libraries the given programs
# load (ldd), one per line, sorted — the runtime half of what scripts/setup.sh installs,
# under whatever names this distribution gives them (Ubuntu 24.04's t64 names included).
# Libraries no package owns (CUDA under /usr/local/cuda, which the CUDA base image
# brings) are named on stderr. OpenBLAS, which the CPU GEMM opens at first use
# (kernels/gemm/gemm_cpu.cc) and ldd therefore does not list, is added by hand.
# Used by deploy/docker/Dockerfile; tests/deploy/deploy_test.cc checks it.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 PROGRAM..." >&2; exit 2; }
owner() {  # the package owning a library path, trying the /usr-merged spellings
  local p=$1 q
  for q in "$p" "$(readlink -f "$p")" "/usr${p#/usr}" "${p#/usr}"; do
    dpkg-query -S "$q" 2>/dev/null | head -1 | cut -d: -f1 && return 0
  done
  return 1
}
libs=$(for b in "$@"; do
  ldd "$b" | awk '/=> not found/ {print "MISSING " $1; next} $3 ~ /^\// {print $3}'
done | sort -u)
if grep -q '^MISSING' <<<"$libs"; then
  echo "runtime-packages: unresolved libraries: $(grep '^MISSING' <<<"$libs" | cut -d' ' -f2 | tr '\n' ' ')" >&2
  exit 1
fi
blas=$(ls /usr/lib/x86_64-linux-gnu/libopenblas.so.0 /usr/lib/*/libopenblas.so.0 2>/dev/null | head -1 || true)
{
  for l in $libs $blas; do
    owner "$l" || echo "runtime-packages: no package owns $l (expected from the base image)" >&2
  done
} | sed 's/:.*//' | sort -u
