#!/usr/bin/env bash
# Keeps the benchmarks of the last packed build (.carry/dist.tar.xz, from make-dist.sh) as
# the baseline of an A/B run: .carry/base.tar.xz holds base/bin/{train_bench,op_bench}
# (statically linked against the project; they use dist/lib's runtime libraries). Run it
# before make-dist.sh packs the change; then scripts/gpu-ab.sh times both in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .carry/dist.tar.xz ] || { echo "make-base: no .carry/dist.tar.xz (run scripts/make-dist.sh on the baseline first)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xJf .carry/dist.tar.xz -C "$tmp" dist/bin/train_bench dist/bin/op_bench
mkdir -p "$tmp/base" && mv "$tmp/dist/bin" "$tmp/base/bin"
echo "${BASE_NAME:-$(git log -1 --format='%h %s' | cut -c1-60)}" > "$tmp/base/NAME"
XZ_OPT=-3 tar -cJf .carry/base.tar.xz -C "$tmp" base
ls -la .carry/base.tar.xz
