// RMSNorm backward sweep: the bf16 row kernel built with different warps per CTA and
// prefetch buffers per warp (kernels/rmsnorm/rmsnorm_cuda.cu compiled once per variant
// with -DTESSERA_RMS_BWD_WARPS/-DTESSERA_RMS_BWD_BUFS and the launcher renamed; see
// build.sh), timed against a copy of the same traffic. Not part of the build.
#include <cstdio>
#include <cuda_runtime.h>
#include "absl/status/status.h"
#include "bench/variants/timing.h"
#include "worker/runtime/dtype.h"
namespace tessera::kernels {
using runtime::DType;
#define DECL(n) absl::Status n(const void*, const void*, const void*, const float*, void*, float*, int64_t, int64_t, DType, void*);
DECL(RmsBwd_w2_b1) DECL(RmsBwd_w3_b1) DECL(RmsBwd_w4_b1) DECL(RmsBwd_w6_b1) DECL(RmsBwd_w8_b1) DECL(RmsBwd_w12_b1) DECL(RmsBwd_w8_b2)
}
using namespace tessera::kernels;
__global__ void Fill(float* r, int64_t n) { for (int64_t i = blockIdx.x * 256 + threadIdx.x; i < n; i += 256LL * gridDim.x) r[i] = 1.f; }
int main() {
  const int64_t R = 16384, C = 2048, n = R * C;
  void *dy, *x, *w, *dx; float *rs, *dw;
  cudaMalloc(&dy, n * 2); cudaMalloc(&x, n * 2); cudaMalloc(&dx, n * 2); cudaMalloc(&w, C * 2); cudaMalloc(&rs, R * 4); cudaMalloc(&dw, C * 4);
  cudaMemset(dy, 0, n * 2); cudaMemset(x, 0, n * 2); cudaMemset(w, 0, C * 2); Fill<<<64, 256>>>(rs, R);
  const double bytes = 3.0 * n * 2 + R * 4 + C * 6;
  struct V { const char* name; decltype(&RmsBwd_w8_b1) f; } vs[] = {{"w2 b1", RmsBwd_w2_b1}, {"w3 b1", RmsBwd_w3_b1}, {"w4 b1", RmsBwd_w4_b1}, {"w6 b1", RmsBwd_w6_b1}, {"w8 b1", RmsBwd_w8_b1}, {"w12 b1", RmsBwd_w12_b1}, {"w8 b2", RmsBwd_w8_b2}};
  for (int rep = 0; rep < 2; ++rep)
    for (auto& v : vs) {
      absl::Status st;
      float ms = TimeMs([&] { st.Update(v.f(dy, x, w, rs, dx, dw, R, C, DType::kBF16, nullptr)); });
      printf("rmsnorm_bwd %-7s %.4f ms %.0f GB/s %s\n", v.name, ms, bytes / ms / 1e6, st.ok() ? "" : st.ToString().c_str());
    }
  void *a, *b; size_t sz = 3 * n * 2 / 2; cudaMalloc(&a, sz); cudaMalloc(&b, sz);
  float ms = TimeMs([&] { cudaMemcpyAsync(b, a, sz, cudaMemcpyDeviceToDevice); });
  printf("memcpy %zu MB (same traffic) %.4f ms %.0f GB/s\n", sz >> 20, ms, 2.0 * sz / ms / 1e6);
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
