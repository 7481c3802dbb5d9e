#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/; clang, ASan + UBSan, into ./build-fuzz) and runs
# each from its checked-in corpus (fuzz/corpus/<target>: seeds and the inputs of crashes
# found and fixed). By default a fixed seed and FUZZ_RUNS (100000) inputs each, so that a
# CI run is reproducible; FUZZ_SECONDS=N instead explores for N seconds each with a random
# seed (run that to look for new bugs). New corpus entries stay in build-fuzz/; a crash
# leaves its input in build-fuzz/artifacts and fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${FUZZ_SECONDS:-}" ]; then budget=(-max_total_time="$FUZZ_SECONDS"); what="${FUZZ_SECONDS} s"
else budget=(-runs="${FUZZ_RUNS:-100000}" -seed=1); what="${FUZZ_RUNS:-100000} inputs, seed 1"; fi
jobs=${TESSERA_BUILD_JOBS:-$(nproc)}
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DTESSERA_FUZZ=ON \
  -DTESSERA_CUDA=OFF > build-fuzz.log 2>&1 || { cat build-fuzz.log; exit 1; }
ninja -C build-fuzz -j "$jobs" fuzz_job_spec fuzz_job_spec_proto fuzz_job_spec_seeds fuzz_tokenizer fuzz_chat_template \
  fuzz_safetensors fuzz_checkpoint >> build-fuzz.log 2>&1 || { tail -50 build-fuzz.log; exit 1; }
mkdir -p build-fuzz/artifacts
# The structure-aware JobSpec fuzzer starts from the example job files, as protos.
rm -rf build-fuzz/seeds && ./build-fuzz/bin/fuzz_job_spec_seeds examples build-fuzz/seeds/job_spec_proto > /dev/null
status=0
for t in job_spec job_spec_proto tokenizer chat_template safetensors checkpoint; do
  work=build-fuzz/corpus/$t
  [ -z "${FUZZ_SECONDS:-}" ] && rm -rf "$work"  # a fixed seed starts from the checked-in corpus alone
  mkdir -p "$work"
  corpora=("$work")
  for d in "fuzz/corpus/$t" "build-fuzz/seeds/$t"; do [ -d "$d" ] && corpora+=("$d"); done
  if ! ./build-fuzz/bin/fuzz_$t "${budget[@]}" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix=build-fuzz/artifacts/$t- -print_final_stats=1 "${corpora[@]}" > "build-fuzz/$t.log" 2>&1; then
    echo "fuzz_$t: FAILED (build-fuzz/$t.log; input in build-fuzz/artifacts)"; tail -30 "build-fuzz/$t.log"; status=1
  else
    echo "fuzz_$t: ok, $(grep -o 'stat::number_of_executed_units: *[0-9]*' "build-fuzz/$t.log" | grep -o '[0-9]*$') runs ($what)"
  fi
done
exit $status
