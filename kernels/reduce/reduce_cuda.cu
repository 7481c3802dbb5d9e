#include "kernels/common/cuda_elem.cuh"
#include "kernels/reduce/reduce.h"

#include <algorithm>

namespace tessera::kernels {
namespace {
template <typename T>
__global__ void SumSq(const T* x, int64_t n, float* out) {
  float s = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = ToF(x[i]);
    s += v * v;
  }
  s = BlockReduce<256>(s, SumOp());
  if (threadIdx.x == 0) atomicAdd(out, s);
}
template <typename T>
__global__ void Scale(T* x, int64_t n, float f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = FromF<T>(ToF(x[i]) * f);
}
}  // namespace

absl::Status SumSquaresCuda(const void* x, int64_t n, DType t, float* out, void* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  unsigned g = std::min<unsigned>(GridFor(n, 256), 1024);
  if (t == DType::kF32) SumSq<<<g, 256, 0, s>>>(static_cast<const float*>(x), n, out);
  else SumSq<<<g, 256, 0, s>>>(static_cast<const __nv_bfloat16*>(x), n, out);
  return LaunchStatus("sum_squares");
}

absl::Status ScaleCuda(void* x, int64_t n, float f, DType t, void* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  if (t == DType::kF32) Scale<<<GridFor(n, 256), 256, 0, s>>>(static_cast<float*>(x), n, f);
  else Scale<<<GridFor(n, 256), 256, 0, s>>>(static_cast<__nv_bfloat16*>(x), n, f);
  return LaunchStatus("scale");
}
}  // namespace tessera::kernels
