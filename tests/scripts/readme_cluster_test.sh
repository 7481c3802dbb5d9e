#!/usr/bin/env bash
# README's "A cluster by hand", run from the README's own code block on loopback: the
# controller line and the worker line with their flags as written — state directory and
# copied secrets in a temporary directory, every address 127.0.0.1 port 0 (the daemons
# publish the ports they bound), the worker's GPUs traded for CPU slots and the GPU
# comm-check for the CPU one, as the README says for machines without GPUs — then every
# `tessera` line of the block against them, each of which must exit 0.
#   bash tests/scripts/readme_cluster_test.sh SOURCE_DIR BIN_DIR
set -euo pipefail
src=$1 bin=$2
tmp=$(mktemp -d /tmp/tessera-readme-XXXXXX)
cleanup() {
  local pids
  pids=$(jobs -p)
  [ -z "$pids" ] || kill $pids 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "readme_cluster_test: $*" >&2; for f in "$tmp"/*.log; do echo "--- $f" >&2; tail -20 "$f" >&2; done; exit 1; }

# The block, continuation lines joined, comments dropped.
block=$(awk '/^## A cluster by hand/ {f = 1} f && /^```sh/ {g = 1; next} g && /^```/ {exit} g' "$src/README.md" |
        sed -e ':a' -e '/\\$/N; s/\\\n//; ta' | grep -v '^#' | sed 's/ *#.*$//')
ctl=$(grep '^tessera-controller ' <<< "$block") || fail "no tessera-controller line in the README's block"
wrk=$(grep '^tessera-worker ' <<< "$block") || fail "no tessera-worker line in the README's block"
cli=$(grep '^tessera ' <<< "$block") || fail "no tessera lines in the README's block"
loopback() { sed -E 's/(0\.0\.0\.0|127\.0\.0\.1):[0-9]+/127.0.0.1:0/g'; }

state=$tmp/state
ctl=$(sed "s#/var/lib/tessera#$state#g" <<< "$ctl" | loopback)
read -ra argv <<< "$ctl"
"$bin/${argv[0]}" "${argv[@]:1}" > "$tmp/controller.log" 2>&1 &
published() {  # the address admin.conf gives once the controller listens ("" before)
  python3 -c 'import json,sys
try: a = json.load(open(sys.argv[1]))["address"]
except Exception: a = ""
print("" if a.endswith(":0") else a)' "$state/admin.conf"
}
address=""
for _ in $(seq 300); do address=$(published); [ -n "$address" ] && break; sleep 0.1; done
[ -n "$address" ] || fail "the controller published no address in $state/admin.conf"

mkdir -p "$tmp/node" && cp "$state/ca.crt" "$state/join-token" "$tmp/node/"  # "copy ca.crt and join-token"
wrk=$(loopback <<< "$wrk" |
      sed -e "s#--controller [^ ]*#--controller $address#" -e "s#--ca-cert ca.crt#--ca-cert $tmp/node/ca.crt#" \
          -e "s#--join-token-file join-token#--join-token-file $tmp/node/join-token#" -e 's/--cpu-slots 0/--cpu-slots 8/')
read -ra argv <<< "$wrk"
"$bin/${argv[0]}" "${argv[@]:1}" --work-dir "$tmp/node/work" > "$tmp/worker.log" 2>&1 &

export TESSERA_CONFIG=$state/admin.conf  # the README's default path, /var/lib/tessera/admin.conf, moved
cd "$src"
job=""
n=0
while read -r line; do
  line=${line//examples\/comm-check-gpu.yaml/examples\/comm-check.yaml}
  [[ $line == *comm-check.yaml* ]] && line=$(sed -E 's/ --set groups\.0\.[a-z.]+=[0-9]+//g' <<< "$line")
  line=${line//<job>/$job}
  read -ra argv <<< "$line"
  n=$((n + 1))
  # `tessera status` right after the start: until the node has registered.
  for attempt in $(seq 50); do
    if "$bin/${argv[0]}" "${argv[@]:1}" > "$tmp/cli$n.log" 2>&1; then ok=1; else ok=0; fi
    if [ "${argv[1]}" != status ] || grep -q READY "$tmp/cli$n.log"; then break; fi
    sleep 0.2
  done
  [ "$ok" = 1 ] || fail "\`$line\` failed"
  if [ "${argv[1]} ${argv[2]:-}" = "job submit" ]; then
    job=$(sed -nE 's/^submitted (\S+).*/\1/p' "$tmp/cli$n.log" | head -1)
    [ -n "$job" ] || fail "\`$line\` printed no job id"
    grep -q "job $job SUCCEEDED" "$tmp/cli$n.log" || fail "\`$line\`: the job did not succeed"
  fi
done <<< "$cli"
[ -n "$job" ] || fail "the README's block submits no job"
grep -q "$job" "$tmp/cli3.log" || fail "\`tessera job list --state succeeded\` does not list $job"
grep -q "\[attempt 1 executor 1 " "$tmp/cli4.log" || fail "\`tessera job logs\` printed no line of executor 1"
echo "readme_cluster_test: the README's cluster by hand ran ($n commands, job $job)"
