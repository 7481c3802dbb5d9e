// Times Tessera's CUDA ops at LLM shapes with CUDA events (after warm-up), and prints
// one JSON line per case: {"op", "shape", "ms", "gbps" or "tflops"}. The peer is
// bench/torch_ops_peer.py, run in the same call by scripts/gpu-bench.sh.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>

#include "worker/runtime/backend.h"

using namespace tessera::runtime;

namespace {

double TimeMs(Backend& b, const std::function<absl::Status()>& fn, int iters = 20, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) if (!fn().ok()) return -1;
  // The backend's stream is private: time the loop on the host between two
  // synchronizations (launches are asynchronous, so their cost overlaps the kernels).
  (void)b.Synchronize();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) if (!fn().ok()) return -1;
  (void)b.Synchronize();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return ms / iters;
}

Tensor Random(Backend& b, std::vector<int64_t> shape, DType t, float scale = 1.f) {
  auto x = *b.Empty(shape, t);
  int64_t n = x.numel();
  std::mt19937 g(42);
  std::normal_distribution<float> d(0, scale);
  std::vector<float> f(n);
  for (auto& v : f) v = d(g);
  if (t == DType::kF32) {
    (void)b.CopyFromHost(f.data(), x);
  } else {
    std::vector<uint16_t> h(n);
    for (int64_t i = 0; i < n; ++i) h[i] = FloatToBf16(f[i]);
    (void)b.CopyFromHost(h.data(), x);
  }
  (void)b.Synchronize();
  return x;
}

void Line(const char* op, const std::string& shape, double ms, const char* unit, double value) {
  printf("{\"op\": \"%s\", \"shape\": \"%s\", \"ms\": %.4f, \"%s\": %.2f}\n", op, shape.c_str(), ms, unit, value);
  fflush(stdout);
}

}  // namespace

int main() {
  auto be = MakeCudaBackend(0);
  if (!be.ok()) {
    fprintf(stderr, "%s\n", be.status().ToString().c_str());
    return 2;
  }
  Backend& b = **be;
  const DType bf = DType::kBF16;
  {  // RMSNorm forward: 16384 tokens x 2048, bf16
    int64_t r = 16384, c = 2048;
    auto x = Random(b, {r, c}, bf), w = Random(b, {c}, bf), y = *b.Empty({r, c}, bf), rs = *b.Empty({r}, DType::kF32);
    double ms = TimeMs(b, [&] { return b.RmsNormForward(x, w, 1e-5f, y, rs); });
    Line("rmsnorm_fwd", "16384x2048 bf16", ms, "gbps", (2.0 * r * c * 2 + r * 4) / ms / 1e6);
  }
  {  // SwiGLU forward: 16384 x 8192 bf16
    int64_t n = 16384LL * 8192;
    auto g = Random(b, {n}, bf), u = Random(b, {n}, bf), y = *b.Empty({n}, bf);
    double ms = TimeMs(b, [&] { return b.SwiGluForward(g, u, y); });
    Line("swiglu_fwd", "16384x8192 bf16", ms, "gbps", 3.0 * n * 2 / ms / 1e6);
  }
  {  // AdamW: 256M f32 params, bf16 grads, bf16 param copy out
    int64_t n = 256LL << 20;
    auto p = Random(b, {n}, DType::kF32), g = Random(b, {n}, bf), m = Random(b, {n}, DType::kF32, 0.1f);
    auto v = Random(b, {n}, DType::kF32, 0.1f), lowp = *b.Empty({n}, bf);
    AdamWParams hp;
    double ms = TimeMs(b, [&] { return b.AdamW(p, g, m, v, hp, &lowp); });
    Line("adamw", "256M f32 (bf16 grad, bf16 out)", ms, "gbps", (4.0 + 2 + 4 + 4 + 4 + 4 + 4 + 2) * n / ms / 1e6);
  }
  struct G { const char* name; int64_t m, n, k; };
  // Llama-3.2-1B shapes at 8192 tokens: y = x @ W^T with W stored [out, in].
  for (G g : {G{"gemm_qkv", 8192, 3072, 2048}, G{"gemm_o", 8192, 2048, 2048}, G{"gemm_gate_up", 8192, 16384, 2048},
              G{"gemm_down", 8192, 2048, 8192}, G{"gemm_lm_head", 8192, 128256, 2048}}) {
    auto a = Random(b, {g.m, g.k}, bf), w = Random(b, {g.n, g.k}, bf, 0.02f), c = *b.Empty({g.m, g.n}, bf);
    double ms = TimeMs(b, [&] { return b.Gemm(a, false, w, true, c); });
    Line(g.name, std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k) + " bf16", ms, "tflops",
         2.0 * g.m * g.n * g.k / ms / 1e9);
  }
  return 0;
}
