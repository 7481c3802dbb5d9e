#!/usr/bin/env bash
# Starts an example server (examples/servers/NAME, Python) in the background on a free
# loopback port, waits until it listens and prints "PID HOST:PORT"; its output goes to LOG.
# The interpreter: the distribution's python3 where it has grpc (scripts/setup.sh installs
# python3-grpcio), else the first python3 on PATH. Exits 1, showing LOG, when the server
# does not start. Arguments after LOG go to the server.
#   read -r pid address < <(bash scripts/start-example-server.sh calculator_env.py /tmp/calc.log)
set -uo pipefail
name=${1:?usage: start-example-server.sh NAME LOG [ARGS...]}
log=${2:?usage: start-example-server.sh NAME LOG [ARGS...]}
shift 2
cd "$(dirname "$0")/.."
py=/usr/bin/python3
"$py" -c "import grpc" 2> /dev/null || py=python3
"$py" "examples/servers/$name" --listen 127.0.0.1:0 "$@" > "$log" 2>&1 &
pid=$!
for _ in $(seq 300); do
  address=$(sed -n 's/^listening on //p' "$log")
  if [ -n "$address" ]; then
    echo "$pid $address"
    exit 0
  fi
  kill -0 $pid 2> /dev/null || break
  sleep 0.1
done
echo "examples/servers/$name did not start:" >&2
cat "$log" >&2
kill $pid 2> /dev/null
exit 1
