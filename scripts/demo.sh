#!/usr/bin/env bash
# Sets everything up, builds, and runs the demo job on `tessera local`: a comm-check
# of every parallel group of a tp=2 dp=2 pp=2 layout over 8 CPU executors (Gloo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
state=$(mktemp -d /tmp/tessera-demo.XXXXXX)
exec ./build/bin/tessera local examples/comm-check.yaml --state-dir "$state" "$@"
