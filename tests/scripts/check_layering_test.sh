#!/usr/bin/env bash
# scripts/check-layering.py accepts the source tree and refuses includes that run upward:
# small trees with one bad include each must fail with the file, the line and the modules
# named; the same trees with the include going downward must pass.
#   check_layering_test.sh SOURCE_DIR
set -uo pipefail
root=${1:?usage: check_layering_test.sh SOURCE_DIR}
check="$root/scripts/check-layering.py"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
bad=0

python3 "$check" "$root" || { echo "FAIL: the source tree breaks the layering"; bad=1; }

# expect_refused FILE INCLUDE: a tree holding only FILE with that include must fail.
expect_refused() {
  local file=$1 inc=$2 dir; dir=$(mktemp -d "$tmp/t.XXXXXX")
  mkdir -p "$dir/$(dirname "$file")"
  printf '#include "%s"\n' "$inc" > "$dir/$file"
  if out=$(python3 "$check" "$dir" 2>&1); then
    echo "FAIL: $file including $inc was accepted"; bad=1
  elif ! grep -q "^$file:1: .* may not include $inc" <<< "$out"; then
    echo "FAIL: $file including $inc: the error does not name them: $out"; bad=1
  fi
}
expect_accepted() {
  local file=$1 inc=$2 dir; dir=$(mktemp -d "$tmp/t.XXXXXX")
  mkdir -p "$dir/$(dirname "$file")"
  printf '#include "%s"\n' "$inc" > "$dir/$file"
  python3 "$check" "$dir" > /dev/null 2>&1 || { echo "FAIL: $file including $inc was refused"; bad=1; }
}

expect_refused kernels/gemm/gemm.h worker/runtime/dtype.h
expect_refused worker/comm/nccl_communicator.cu worker/executor/cuda_buffer_space.h
expect_refused common/spec/job_spec.h worker/parallel/layout.h
expect_refused common/status.h common/rpc/grpc_util.h
expect_refused common/util.h tessera/v1/common.pb.h
expect_refused worker/agent/devices.cc worker/comm/nccl_communicator.h
expect_refused controller/admission.cc worker/train/trainer.h
expect_refused client/main.cc worker/executor/executor.h
expect_refused worker/model/llama.h worker/train/trainer.h

expect_accepted kernels/gemm/gemm.h common/dtype.h
expect_accepted worker/executor/train.cc kernels/gemm/gemm.h
expect_accepted controller/admission.cc common/plan/plan.h
expect_accepted client/main.cc worker/agent/agent.h
expect_accepted tests/anything.cc worker/executor/executor.h

[ $bad = 0 ] && echo "check_layering: the tree passes; 9 upward includes refused, 5 downward accepted"
exit $bad
