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
  curl procps iproute2 clang libclang-rt-dev libcivetweb-dev python3
)
# python3: the test that every script's Python parses (tests/scripts/check_scripts.sh).
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
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
