// RMSNorm backward sweep: the bf16 row kernel built with and without a programmatic
// dependent launch, DwReduce with 32 or 16 columns per CTA, different warps per CTA and
// prefetch buffers per warp (kernels/rmsnorm/rmsnorm_cuda.cu compiled once per variant
// with -DTESSERA_RMS_BWD_PDL/_RCOLS/_WARPS/_BUFS and the launcher renamed
// RmsBwd_p<pdl>_<rcols>_<warps>_<bufs>;
// build.sh passes the list as RMS_VARIANTS), timed against a copy of the same traffic,
// and checked: every variant's dx and dw must equal
// the first variant's bit for bit (same math, same summation order per column within a
// row; dw's summation order differs between variants, so dw is compared to 1e-5). Not part of the build.
#include <cmath>
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>
#include "absl/status/status.h"
#include "bench/variants/timing.h"
#include "common/dtype.h"
namespace tessera::kernels {
#define X(n) absl::Status RmsBwd_##n(const void*, const void*, const void*, const float*, void*, float*, int64_t, int64_t, DType, void*, const void*);
RMS_VARIANTS
#undef X
}
using namespace tessera::kernels;
using tessera::DType;
__global__ void Fill(uint16_t* p, int64_t n, uint32_t seed) {  // bf16 values in about [-2, 2)
  for (int64_t i = blockIdx.x * 256 + threadIdx.x; i < n; i += 256LL * gridDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    const float f = (int(h & 0xffff) - 32768) / 16384.f;
    p[i] = uint16_t(__float_as_uint(f) >> 16);
  }
}
__global__ void FillF(float* r, int64_t n) { for (int64_t i = blockIdx.x * 256 + threadIdx.x; i < n; i += 256LL * gridDim.x) r[i] = 0.5f + (i % 7) * 0.1f; }
int main() {
  const int64_t R = 16384, C = 2048, n = R * C;
  void *dy, *x, *w, *dx; float *rs, *dw;
  cudaMalloc(&dy, n * 2); cudaMalloc(&x, n * 2); cudaMalloc(&dx, n * 2); cudaMalloc(&w, C * 2); cudaMalloc(&rs, R * 4); cudaMalloc(&dw, C * 4);
  Fill<<<256, 256>>>((uint16_t*)dy, n, 1); Fill<<<256, 256>>>((uint16_t*)x, n, 2); Fill<<<8, 256>>>((uint16_t*)w, C, 3); FillF<<<64, 256>>>(rs, R);
  const double bytes = 3.0 * n * 2 + R * 4 + C * 6;
  using Launcher = absl::Status (*)(const void*, const void*, const void*, const float*, void*, float*, int64_t, int64_t, DType, void*,
                                    const void*);
  struct V { const char* name; Launcher f; };
  std::vector<V> vs = {
#define X(n) {#n, RmsBwd_##n},
      RMS_VARIANTS
#undef X
  };
  std::vector<uint16_t> ref_dx(n), got_dx(n);
  std::vector<float> ref_dw(C), got_dw(C);
  for (size_t i = 0; i < vs.size(); ++i) {
    cudaMemset(dx, 0xff, n * 2); cudaMemset(dw, 0xff, C * 4);
    absl::Status st = vs[i].f(dy, x, w, rs, dx, dw, R, C, DType::kBF16, nullptr, nullptr);
    cudaMemcpy(got_dx.data(), dx, n * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(got_dw.data(), dw, C * 4, cudaMemcpyDeviceToHost);
    if (i == 0) { ref_dx = got_dx; ref_dw = got_dw; continue; }
    int64_t bad_dx = 0, bad_dw = 0;
    for (int64_t j = 0; j < n; ++j) bad_dx += got_dx[j] != ref_dx[j];
    for (int64_t j = 0; j < C; ++j) bad_dw += !(std::fabs(got_dw[j] - ref_dw[j]) <= 1e-5f * (1.f + std::fabs(ref_dw[j])));
    printf("check %-8s dx mismatches %lld, dw mismatches %lld %s\n", vs[i].name, (long long)bad_dx, (long long)bad_dw,
           st.ok() ? "" : st.ToString().c_str());
  }
  for (int rep = 0; rep < 2; ++rep)
    for (auto& v : vs) {
      absl::Status st;
      float ms = TimeMs([&] { st.Update(v.f(dy, x, w, rs, dx, dw, R, C, DType::kBF16, nullptr, nullptr)); });
      printf("rmsnorm_bwd %-8s %.4f ms %.0f GB/s %s\n", v.name, ms, bytes / ms / 1e6, st.ok() ? "" : st.ToString().c_str());
      // With the residual's gradient added in place (add = dx, as the model runs it): one
      // more row read. (dx drifts over the repetitions; only the time matters here.)
      ms = TimeMs([&] { st.Update(v.f(dy, x, w, rs, dx, dw, R, C, DType::kBF16, nullptr, dx)); });
      printf("rmsnorm_bwd_add %-8s %.4f ms %.0f GB/s %s\n", v.name, ms, (bytes + n * 2.0) / ms / 1e6,
             st.ok() ? "" : st.ToString().c_str());
    }
  void *a, *b; size_t sz = 3 * n * 2 / 2; cudaMalloc(&a, sz); cudaMalloc(&b, sz);
  float ms = TimeMs([&] { cudaMemcpyAsync(b, a, sz, cudaMemcpyDeviceToDevice); });
  printf("memcpy %zu MB (same traffic) %.4f ms %.0f GB/s\n", sz >> 20, ms, 2.0 * sz / ms / 1e6);
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
