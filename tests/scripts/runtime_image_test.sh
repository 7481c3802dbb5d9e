#!/usr/bin/env bash
# The container images' runtime stages, as far as a machine without a Docker engine can
# build them: scripts/check-runtime-image.sh over this build's programs (a debootstrap
# root per stage, its packages, the CLI and the daemon run as uid 10001). Needs root and
# debootstrap (scripts/setup.sh installs it); skipped (exit 77) without them.
#   bash tests/scripts/runtime_image_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
if [ "$(id -u)" -ne 0 ] || ! command -v debootstrap > /dev/null; then
  echo "skipped: needs root and debootstrap (scripts/setup.sh installs it)"; exit 77
fi
export RUNTIME_ROOT=$build/runtime-root
bash "$src/scripts/check-runtime-image.sh" "$build"
rc=$?
rm -rf "$RUNTIME_ROOT"-controller "$RUNTIME_ROOT"-worker  # the stages' roots (the base stays for the next run)
exit $rc
