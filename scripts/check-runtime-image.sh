#!/usr/bin/env bash
# What deploy/docker/Dockerfile's runtime stages do, checked without a Docker engine (none
# runs on our machines): for each stage (controller, worker) a minimal Debian 12 root
# (debootstrap --variant=minbase, from Debian's mirror), the packages
# scripts/runtime-packages.sh names for that stage's programs installed with
# --no-install-recommends, the programs copied in, and then:
#   - every library resolves (the CUDA ones the CUDA base image brings are copied to
#     /usr/local/cuda/lib of the worker's root, as there);
#   - no compiler and no -dev package is in the root;
#   - as uid 10001, the CLI answers --help in both; the controller makes its secrets,
#     starts, serves health and writes admin.conf; the worker answers --help.
# Needs root, debootstrap and network access to the Debian mirror; takes a few minutes.
# Usage: sudo bash scripts/check-runtime-image.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}/bin
base=${RUNTIME_ROOT:-/tmp/tessera-runtime-root}
if [ ! -x "$base/bin/sh" ]; then
  debootstrap --variant=minbase bookworm "$base" http://deb.debian.org/debian > /tmp/debootstrap.log 2>&1 \
    || { tail -20 /tmp/debootstrap.log; exit 1; }
fi
fail=0
mounted=()
trap 'for m in "${mounted[@]}"; do umount "$m" 2>/dev/null || true; done' EXIT
for stage in controller worker; do
  root=$base-$stage
  rm -rf "$root" && cp -a "$base" "$root"
  progs=("$bin/tessera" "$bin/tessera-$stage")
  pkgs=$(bash scripts/runtime-packages.sh "${progs[@]}" 2>/tmp/runtime-packages.err)
  echo "== $stage stage: $(echo $pkgs)"
  mount --bind /proc "$root/proc"; mounted+=("$root/proc")
  chroot "$root" apt-get update -qq
  chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ca-certificates $pkgs \
    > /tmp/runtime-install-$stage.log
  install -m 0755 "${progs[@]}" "$root/usr/local/bin/"
  if [ $stage = worker ]; then
    mkdir -p "$root/usr/local/cuda/lib"
    for l in $(ldd "$bin/tessera-worker" | awk '$3 ~ /^\/usr\/local\/cuda/ {print $3}'); do cp -L "$l" "$root/usr/local/cuda/lib/"; done
    echo /usr/local/cuda/lib > "$root/etc/ld.so.conf.d/cuda.conf"
  fi
  chroot "$root" ldconfig
  for p in tessera tessera-$stage; do
    if chroot "$root" ldd "/usr/local/bin/$p" | grep -q "not found"; then
      echo "FAIL $p: $(chroot "$root" ldd "/usr/local/bin/$p" | grep 'not found' | tr '\n' ' ')"; fail=1
    else echo "ok   $p: every library resolves"; fi
  done
  for c in gcc g++ cc c++ clang cmake ninja nvcc; do
    if chroot "$root" sh -c "command -v $c" > /dev/null; then echo "FAIL a compiler or build tool is in the root: $c"; fail=1; fi
  done
  dev=$(chroot "$root" dpkg-query -W -f '${Package}\n' | grep -- '-dev$' || true)
  [ -z "$dev" ] && echo "ok   no compiler, build tool or -dev package" || { echo "FAIL -dev packages: $dev"; fail=1; }
  for p in tessera tessera-$stage; do
    if chroot --userspec=10001:10001 "$root" $p --help > /dev/null; then echo "ok   $p --help as uid 10001"
    else echo "FAIL $p --help"; fail=1; fi
  done
  if [ $stage = controller ]; then
    rm -rf "$root/var/lib/tessera" "$root/etc/tessera"
    install -d -o 10001 -g 10001 -m 0700 "$root/var/lib/tessera"
    install -d -o 10001 -g 10001 "$root/etc/tessera"
    chroot --userspec=10001:10001 "$root" tessera-controller init-secrets --out /etc/tessera/secrets > /dev/null
    chroot --userspec=10001:10001 "$root" tessera-controller --state-dir /var/lib/tessera --secrets-dir /etc/tessera/secrets \
      --listen 127.0.0.1:0 --health-listen 127.0.0.1:0 --dashboard-listen 127.0.0.1:0 > /tmp/runtime-controller.log 2>&1 &
    pid=$!
    for _ in $(seq 100); do [ -f "$root/var/lib/tessera/admin.conf" ] && break; sleep 0.1; done
    if grep -q health_address "$root/var/lib/tessera/admin.conf" 2>/dev/null; then
      echo "ok   the controller runs as uid 10001: $(grep -o '"address": "[^"]*"' "$root/var/lib/tessera/admin.conf")"
    else echo "FAIL the controller did not start:"; cat /tmp/runtime-controller.log; fail=1; fi
    kill $pid; wait $pid 2>/dev/null || true
  fi
done
[ $fail = 0 ] && echo "runtime image check: PASSED" || echo "runtime image check: FAILED"
exit $fail
