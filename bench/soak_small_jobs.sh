#!/usr/bin/env bash
# Small jobs back to back on a loaded machine: no job may fail for anything but its own
# input. A controller and one agent (2 CPU slots) on loopback, as `tessera-controller` and
# `tessera-worker` run in production (TLS, tokens); LOAD busy loops keep every core busy
# meanwhile; JOBS jobs are submitted one after another with `tessera job submit` and each
# must end SUCCEEDED. Prints one line per failure (the job's reason) and a summary table;
# exits 1 if any job failed. SOAK_KEEP=1 keeps the daemons' state and logs (the path is
# printed first).
#   bash bench/soak_small_jobs.sh [JOBS (200)] [LOAD (cores)]     (after scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${1:-200}
load=${2:-$(nproc)}
bin=${TESSERA_BIN:-build/bin}
dir=$(mktemp -d /tmp/tessera-soak.XXXXXX)
[ -z "${SOAK_KEEP:-}" ] || echo "state and logs in $dir"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${SOAK_KEEP:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT

"$bin/tessera-controller" --state-dir "$dir/controller" --listen 127.0.0.1:0 --path-root "$dir" \
  > "$dir/controller.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -f "$dir/controller/admin.conf" ] && break; sleep 0.05; done
address=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["address"])' "$dir/controller/admin.conf")
"$bin/tessera-worker" --controller "$address" --ca-cert "$dir/controller/ca.crt" \
  --join-token-file "$dir/controller/join-token" --node-id soak --cpu-slots 2 --work-dir "$dir/agent" \
  > "$dir/agent.log" 2>&1 &
pids+=($!)
cli=("$bin/tessera" --config "$dir/controller/admin.conf")
for _ in $(seq 200); do "${cli[@]}" status 2>/dev/null | grep -q ' READY ' && break; sleep 0.1; done

cat > "$dir/job.yaml" <<'YAML'
name: soak
kind: comm-check
groups:
  - {name: w, devices: 2, layout: {tp: 2}}
comm_check: {sizes: [4KiB], iters: 2, collectives: [all_reduce, broadcast]}
YAML

for _ in $(seq "$load"); do (while :; do :; done) & pids+=($!); done

start=$(date +%s.%N)
ok=0
failed=0
for i in $(seq "$jobs"); do
  if "${cli[@]}" job submit -f "$dir/job.yaml" > "$dir/job.out" 2>&1; then
    ok=$((ok + 1))
  else
    failed=$((failed + 1))
    echo "job $i failed: $(grep -E '^job .* (FAILED|STOPPED)|^error' "$dir/job.out" | tail -1)"
  fi
done
end=$(date +%s.%N)

restarts=$("${cli[@]}" -o json job list --limit 0 | python3 -c '
import json, sys
print(sum(int(j.get("restarts", 0)) for j in json.load(sys.stdin)))')
wall=$(python3 -c "print(f'{$end - $start:.1f}')")
printf '\n%-8s %-6s %-10s %-6s %-8s %-9s %-10s %s\n' JOBS CORES LOAD_PROCS OK FAILED RESTARTS WALL_S JOBS_PER_MIN
printf '%-8s %-6s %-10s %-6s %-8s %-9s %-10s %s\n' "$jobs" "$(nproc)" "$load" "$ok" "$failed" "$restarts" "$wall" \
  "$(python3 -c "print(f'{$jobs / ($end - $start) * 60:.1f}')")"
[ "$failed" -eq 0 ]
