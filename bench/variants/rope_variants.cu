// RoPE kernel sweep: the bf16 vector kernel built with different heads per thread and
// block sizes (kernels/rope/rope_cuda.cu compiled once per variant with
// -DTESSERA_ROPE_HEADS/-DTESSERA_ROPE_BLOCK and the launcher renamed; see build.sh), timed
// side by side with device-to-device copies of the same and larger sizes. Prints one line
// per variant. Not part of the build: bench/variants/build.sh makes it.
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>
#include "absl/status/status.h"
#include "bench/variants/timing.h"
#include "common/dtype.h"
namespace tessera::kernels {
#define DECL(n) absl::Status n(const void*, const int32_t*, void*, int64_t, int64_t, int64_t, float, float, DType, void*);
DECL(Rope_h2_b128) DECL(Rope_h4_b128) DECL(Rope_h8_b128) DECL(Rope_h4_b256) DECL(Rope_h8_b256) DECL(Rope_h16_b128)
}
using namespace tessera::kernels;
using tessera::DType;
int main() {
  const int64_t T = 16384, H = 32, D = 64, n = T * H * D;
  void *x, *y; int32_t* pos;
  cudaMalloc(&x, n * 2); cudaMalloc(&y, n * 2); cudaMalloc(&pos, T * 4);
  std::vector<int32_t> hp(T); for (int i = 0; i < T; ++i) hp[i] = i;
  cudaMemcpy(pos, hp.data(), T * 4, cudaMemcpyHostToDevice);
  cudaMemset(x, 0, n * 2);
  const double bytes = 2.0 * n * 2 + T * 4;
  struct V { const char* name; decltype(&Rope_h2_b128) f; } vs[] = {{"h2 b128", Rope_h2_b128}, {"h4 b128", Rope_h4_b128},
      {"h8 b128", Rope_h8_b128}, {"h4 b256", Rope_h4_b256}, {"h8 b256", Rope_h8_b256}, {"h16 b128", Rope_h16_b128}};
  for (int rep = 0; rep < 2; ++rep)
  for (auto& v : vs) {
    float ms = TimeMs([&] { (void)v.f(x, pos, y, T, H, D, 10000.f, 1.f, DType::kBF16, nullptr); });
    printf("rope %-9s %.4f ms %.0f GB/s\n", v.name, ms, bytes / ms / 1e6);
  }
  for (size_t sz : {size_t(n * 2), size_t(256) << 20, size_t(1) << 30}) {
    void *a, *b; cudaMalloc(&a, sz); cudaMalloc(&b, sz);
    float ms = TimeMs([&] { cudaMemcpyAsync(b, a, sz, cudaMemcpyDeviceToDevice); });
    printf("memcpy %zu MB %.4f ms %.0f GB/s\n", sz >> 20, ms, 2.0 * sz / ms / 1e6);
    cudaFree(a); cudaFree(b);
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
