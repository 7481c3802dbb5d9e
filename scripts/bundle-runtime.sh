#!/usr/bin/env bash
# Copies into DEST the shared libraries that the given executables load and that a GPU
# host without the build's -dev packages (gRPC, protobuf, Abseil, Gloo, yaml-cpp, ...) may
# lack; run the executables there with LD_LIBRARY_PATH=DEST. The C runtime and the
# CUDA, cuBLAS, cuDNN, NCCL and driver libraries are left out: those must be the host's
# own, matching its driver.
#   scripts/bundle-runtime.sh DEST EXECUTABLE_OR_LIBRARY...
set -euo pipefail
if [ $# -lt 2 ]; then echo "usage: $0 DEST EXECUTABLE_OR_LIBRARY..." >&2; exit 2; fi
dest=$1
shift
mkdir -p "$dest"
host_owned='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libcublasLt|libnccl|libcudnn|libnvidia|libnvrtc|libcurand|libcusparse|libcufft|libnvJitLink)'
for f in "$@"; do
  while read -r name path; do
    if [[ $name =~ $host_owned ]] || [ -e "$dest/$name" ]; then continue; fi
    cp -L "$path" "$dest/$name"
  done < <(ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
done
