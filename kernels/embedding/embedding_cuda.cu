#include "kernels/common/cuda_elem.cuh"
#include "kernels/embedding/embedding.h"

namespace tessera::kernels {
namespace {
template <typename T>
__global__ void Forward(const int32_t* ids, const T* table, T* out, int64_t n, int64_t rows, int64_t hidden, int64_t start) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n * hidden; k += int64_t(gridDim.x) * blockDim.x) {
    int64_t i = k / hidden, h = k % hidden, r = ids[i] - start;
    out[k] = (r >= 0 && r < rows) ? table[r * hidden + h] : FromF<T>(0.f);
  }
}
template <typename T>
__global__ void Backward(const int32_t* ids, const T* dout, float* dtable, int64_t n, int64_t rows, int64_t hidden, int64_t start) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n * hidden; k += int64_t(gridDim.x) * blockDim.x) {
    int64_t i = k / hidden, h = k % hidden, r = ids[i] - start;
    if (r >= 0 && r < rows) atomicAdd(&dtable[r * hidden + h], ToF(dout[k]));
  }
}
}  // namespace

absl::Status EmbeddingForwardCuda(const int32_t* ids, const void* table, void* out, int64_t n, int64_t rows,
                                  int64_t hidden, int64_t start, DType t, void* stream) {
  if (n * hidden == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  unsigned g = GridFor(n * hidden, 256);
  if (t == DType::kF32) Forward<<<g, 256, 0, s>>>(ids, static_cast<const float*>(table), static_cast<float*>(out), n, rows, hidden, start);
  else Forward<<<g, 256, 0, s>>>(ids, static_cast<const __nv_bfloat16*>(table), static_cast<__nv_bfloat16*>(out), n, rows, hidden, start);
  return LaunchStatus("embedding_forward");
}

absl::Status EmbeddingBackwardCuda(const int32_t* ids, const void* dout, float* dtable, int64_t n, int64_t rows,
                                   int64_t hidden, int64_t start, DType t, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (n * hidden == 0) return absl::OkStatus();
  unsigned g = GridFor(n * hidden, 256);
  if (t == DType::kF32) Backward<<<g, 256, 0, s>>>(ids, static_cast<const float*>(dout), dtable, n, rows, hidden, start);
  else Backward<<<g, 256, 0, s>>>(ids, static_cast<const __nv_bfloat16*>(dout), dtable, n, rows, hidden, start);
  return LaunchStatus("embedding_backward");
}
}  // namespace tessera::kernels
