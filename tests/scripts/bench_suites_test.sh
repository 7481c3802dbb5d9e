#!/usr/bin/env bash
# bench/suites.py: every suite in bench/suites is well formed, and a suite whose commands
# print canned records gives the table those records mean (the best peer variant, the
# ratio in Tessera's favour for both directions, the fraction of a limit read from another
# record, a skipped run, a malformed row refused).
set -euo pipefail
src=$1
py="python3 $src/bench/suites.py"
$py --check
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/suites"
cat > "$tmp/suites/fake.json" <<'JSON'
{"title": "canned records",
 "runs": [
  {"id": "ours", "cmd": "echo not json; echo '{\"op\": \"gemm\", \"ms\": 2.0, \"tflops\": 395}'; echo '{\"op\": \"copy\", \"ms\": 1.0, \"gbps\": 3000}'"},
  {"id": "peer", "cmd": "echo '{\"op\": \"gemm\", \"variant\": \"eager\", \"ms\": 4.0}'; echo '{\"op\": \"gemm\", \"variant\": \"compile\", \"ms\": 2.5}'; echo '{\"op\": \"device_copy\", \"gbps\": 4000}'; echo '{\"op\": \"copy\", \"variant\": \"eager\", \"ms\": 0.5}'"},
  {"id": "big", "cmd": "echo '{\"tokens_per_s\": 1}'", "min_gpus": 64}
 ],
 "rows": [
  {"name": "{each}", "for_each": "op", "unit": "ms", "better": "lower",
   "tessera": {"run": "ours", "where": {"op": "{each}"}, "metric": "ms"},
   "peer": {"run": "peer", "where": {"op": "{each}"}, "metric": "ms", "label": "variant"},
   "limit": [{"metric": "tflops", "max": 790, "what": "of GEMM"},
             {"metric": "gbps", "max": {"run": "peer", "where": {"op": "device_copy"}, "metric": "gbps"}, "what": "of copy"}]},
  {"name": "needs many GPUs", "tessera": {"run": "big", "metric": "tokens_per_s"}}
 ]}
JSON
$py --dir "$tmp/suites" --out "$tmp/out" --gpus 1 fake > "$tmp/table.txt" 2> "$tmp/log.txt"
cat "$tmp/table.txt"
expect() { grep -E -- "$1" "$tmp/table.txt" > /dev/null || { echo "expected a line matching: $1" >&2; exit 1; }; }
expect '^gemm +ms +2 +2\.5 \(compile\) +1\.25x +50% of GEMM'
expect '^copy +ms +1 +0\.5 \(eager\) +0\.50x +75% of copy'
expect '^needs many GPUs .*needs 64 GPUs'
grep -q '| gemm | ms |' "$tmp/out/fake.md"
# A row naming a run the suite does not have is refused before anything runs.
sed 's/"run": "big"/"run": "missing"/' "$tmp/suites/fake.json" > "$tmp/suites/broken.json"
if $py --dir "$tmp/suites" --out "$tmp/out" broken > /dev/null 2> "$tmp/err.txt"; then
  echo "a malformed suite ran" >&2; exit 1
fi
grep -q "names run 'missing', not in the suite" "$tmp/err.txt"
echo "bench suites: ok"
