# Sourced by the scripts that run on a GPU host (gpu-tests.sh, gpu-bench.sh): unpacks the installed tree and sets the environment they share.
# dist/ travels compressed (.carry/dist.tar.xz) to stay under the tree-size limit;
# with GPU_ENV_KEEP_DIST=1 an already unpacked dist/ is kept.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -f .carry/dist.tar.xz ] && { [ "${GPU_ENV_KEEP_DIST:-0}" != 1 ] || [ ! -d dist ]; }; then
  # A transfer that broke off can leave a truncated archive (seen once): stop rather than
  # run whatever part of dist/ came out of it.
  rm -rf dist && tar -xJf .carry/dist.tar.xz || { echo "gpu-env: .carry/dist.tar.xz is damaged; run it again" >&2; exit 3; }
fi
export LD_LIBRARY_PATH=$PWD/dist/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/tessera-gpu-out}
mkdir -p "$OUT"
# cuDNN (the attention forward's second path, loaded at first use): from the loader's
# path if it is there, else the CUDA toolkit's lib folders, else PyTorch's wheel.
if ! ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9'; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib \
           "$(python3 -c 'import nvidia.cudnn as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)"; do
    if [ -n "$d" ] && [ -e "$d/libcudnn.so.9" ]; then export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d; break; fi
  done
fi
