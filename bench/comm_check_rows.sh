#!/usr/bin/env bash
# comm-check through the daemons (`tessera local`, examples/comm-check-gpu.yaml) over every
# visible GPU as one DP group: its result table as JSON lines, one per collective and size
# (bench/suites.py reads them). Run from the repository root with dist/ installed.
set -uo pipefail
ngpu=$(nvidia-smi -L | wc -l)
state=$(mktemp -d)
dist/bin/tessera -o json local examples/comm-check-gpu.yaml --state-dir "$state" \
  --set groups.0.devices="$ngpu" --set groups.0.layout.dp="$ngpu" > "$state/job.json" || exit $?
python3 - "$state/job.json" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
for row in json.loads(job.get("resultJson", "{}")).get("comm_check", []):
    print(json.dumps(row))
PY
