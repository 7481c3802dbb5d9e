# Sourced by the scripts that run on a lent GPU host (gpu-check.sh, gpu-kernels.sh,
# gpu-bench.sh): unpacks the installed tree and sets the environment they share.
# dist/ travels compressed (.carry/dist.tar.xz) to stay under the tree-size limit;
# with GPU_ENV_KEEP_DIST=1 an already unpacked dist/ is kept.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -f .carry/dist.tar.xz ] && { [ "${GPU_ENV_KEEP_DIST:-0}" != 1 ] || [ ! -d dist ]; }; then
  rm -rf dist && tar -xJf .carry/dist.tar.xz
fi
export LD_LIBRARY_PATH=$PWD/dist/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/tessera-gpu-out}
mkdir -p "$OUT"
