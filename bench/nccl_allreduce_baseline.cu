// The peer for comm-check's NCCL numbers: a plain NCCL all-reduce loop in one
// process over all visible GPUs (like nccl-tests' all_reduce_perf, float sum,
// out of place), timed with CUDA events. Prints one line per size:
//   size_bytes time_us algbw_GBps busbw_GBps
// Usage: nccl_allreduce_baseline [sizes...] (default 1GiB), env ITERS, WARMUP.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK_CUDA(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
#define CHECK_NCCL(x) do { ncclResult_t r = (x); if (r != ncclSuccess) { fprintf(stderr, "%s: %s\n", #x, ncclGetErrorString(r)); return 1; } } while (0)

__global__ void Fill(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v;
}

int main(int argc, char** argv) {
  int n = 0;
  CHECK_CUDA(cudaGetDeviceCount(&n));
  if (n < 2) { fprintf(stderr, "need at least 2 GPUs, found %d\n", n); return 2; }
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  if (sizes.empty()) sizes.push_back(1ull << 30);
  int iters = getenv("ITERS") ? atoi(getenv("ITERS")) : 20;
  int warmup = getenv("WARMUP") ? atoi(getenv("WARMUP")) : 5;
  std::vector<ncclComm_t> comms(n);
  std::vector<int> devs(n);
  for (int i = 0; i < n; ++i) devs[i] = i;
  CHECK_NCCL(ncclCommInitAll(comms.data(), n, devs.data()));
  std::vector<cudaStream_t> streams(n);
  for (int i = 0; i < n; ++i) { CHECK_CUDA(cudaSetDevice(i)); CHECK_CUDA(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking)); }
  for (size_t bytes : sizes) {
    size_t count = bytes / sizeof(float);
    std::vector<float*> in(n), out(n);
    for (int i = 0; i < n; ++i) {
      CHECK_CUDA(cudaSetDevice(i));
      CHECK_CUDA(cudaMalloc(&in[i], count * sizeof(float)));
      CHECK_CUDA(cudaMalloc(&out[i], count * sizeof(float)));
      Fill<<<1024, 256, 0, streams[i]>>>(in[i], count, 1.0f + i);
    }
    auto run = [&]() -> int {
      CHECK_NCCL(ncclGroupStart());
      for (int i = 0; i < n; ++i) CHECK_NCCL(ncclAllReduce(in[i], out[i], count, ncclFloat, ncclSum, comms[i], streams[i]));
      CHECK_NCCL(ncclGroupEnd());
      return 0;
    };
    for (int w = 0; w < warmup; ++w) if (run()) return 1;
    for (int i = 0; i < n; ++i) { CHECK_CUDA(cudaSetDevice(i)); CHECK_CUDA(cudaStreamSynchronize(streams[i])); }
    cudaEvent_t t0, t1;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaEventCreate(&t0));
    CHECK_CUDA(cudaEventCreate(&t1));
    CHECK_CUDA(cudaEventRecord(t0, streams[0]));
    for (int it = 0; it < iters; ++it) if (run()) return 1;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaEventRecord(t1, streams[0]));
    for (int i = 0; i < n; ++i) { CHECK_CUDA(cudaSetDevice(i)); CHECK_CUDA(cudaStreamSynchronize(streams[i])); }
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
    // Check: every element equals sum(1+i).
    float want = 0;
    for (int i = 0; i < n; ++i) want += 1.0f + i;
    float got = 0;
    CHECK_CUDA(cudaSetDevice(n - 1));
    CHECK_CUDA(cudaMemcpy(&got, out[n - 1] + count - 1, sizeof(float), cudaMemcpyDeviceToHost));
    if (got != want) { fprintf(stderr, "wrong result: %f != %f\n", got, want); return 1; }
    double t = ms / 1e3 / iters;
    double algbw = bytes / t / 1e9;
    printf("%zu %.1f %.2f %.2f\n", bytes, t * 1e6, algbw, algbw * 2.0 * (n - 1) / n);
    for (int i = 0; i < n; ++i) { cudaSetDevice(i); cudaFree(in[i]); cudaFree(out[i]); }
  }
  for (auto c : comms) ncclCommDestroy(c);
  return 0;
}
