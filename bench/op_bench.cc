// Times Tessera's CUDA ops at LLM shapes with CUDA events (after warm-up), and prints
// one JSON line per case: {"op", "shape", "ms", "gbps" or "tflops"}. The peer is
// bench/torch_ops_peer.py, run in the same call by `scripts/gpu-bench.sh kernels`.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention/cudnn_attention.h"
#include "kernels/decode/decode_linear.h"
#include "common/status.h"
#include "worker/runtime/backend.h"

using namespace tessera::runtime;
using tessera::DType;
using tessera::FloatToBf16;

namespace {

constexpr int kShortIters = 100;

double TimeMs(Backend& b, const std::function<absl::Status()>& fn, int iters = 20, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) if (!fn().ok()) return -1;
  // The backend's stream is private: time the loop on the host between two
  // synchronizations (launches are asynchronous, so their cost overlaps the kernels). Ops
  // under 0.1 ms pass kShortIters calls, so that the final synchronization's latency
  // (~10-20 us) stays under 1% of the loop; the rest run as many calls as the peer (20) —
  // longer loops heat the card and run slower (GEMM LM head: 0.95x at 100 calls).
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

// ", graph: K kernels, P programmatic edges, M memory nodes" for a row's detail.
std::string GraphShape(const Backend::Graph& g) {
  const Backend::Graph::Shape s = g.shape();
  return ", graph: " + std::to_string(s.kernels) + " kernels, " + std::to_string(s.programmatic_edges) + " programmatic edges, " +
         std::to_string(s.memory_nodes) + " memory nodes";
}

}  // namespace

int main(int argc, char** argv) {
  // Optional argument: run only the cases whose group name starts with it (e.g. "attn").
  const std::string only = argc > 1 ? argv[1] : "";
  auto Want = [&](const std::string& group) { return only.empty() || group.rfind(only, 0) == 0 || only.rfind(group, 0) == 0; };
  auto be = MakeCudaBackend(0);
  if (!be.ok()) {
    fprintf(stderr, "%s\n", be.status().ToString().c_str());
    return 2;
  }
  Backend& b = **be;
  const DType bf = DType::kBF16;
  if (Want("rmsnorm")) {  // RMSNorm forward: 16384 tokens x 2048, bf16
    int64_t r = 16384, c = 2048;
    auto x = Random(b, {r, c}, bf), w = Random(b, {c}, bf), y = *b.Empty({r, c}, bf), rs = *b.Empty({r}, DType::kF32);
    double ms = TimeMs(b, [&] { return b.RmsNormForward(x, w, 1e-5f, y, rs); }, kShortIters);
    Line("rmsnorm_fwd", "16384x2048 bf16", ms, "gbps", (2.0 * r * c * 2 + r * 4) / ms / 1e6);
    auto dy = Random(b, {r, c}, bf), dx = *b.Empty({r, c}, bf), dw = *b.Empty({c}, DType::kF32);
    ms = TimeMs(b, [&] { return b.RmsNormBackward(dy, x, w, rs, dx, dw); }, kShortIters);
    Line("rmsnorm_bwd", "16384x2048 bf16", ms, "gbps", (3.0 * r * c * 2 + r * 4 + c * 6) / ms / 1e6);
  }
  if (Want("swiglu")) {  // SwiGLU forward: 16384 x 8192 bf16
    int64_t n = 16384LL * 8192;
    auto g = Random(b, {n}, bf), u = Random(b, {n}, bf), y = *b.Empty({n}, bf);
    double ms = TimeMs(b, [&] { return b.SwiGluForward(g, u, y); });
    Line("swiglu_fwd", "16384x8192 bf16", ms, "gbps", 3.0 * n * 2 / ms / 1e6);
    auto dy = Random(b, {n}, bf), dg = *b.Empty({n}, bf), du = *b.Empty({n}, bf);
    ms = TimeMs(b, [&] { return b.SwiGluBackward(dy, g, u, dg, du); });
    Line("swiglu_bwd", "16384x8192 bf16", ms, "gbps", 5.0 * n * 2 / ms / 1e6);
  }
  if (Want("adamw")) {  // AdamW: 256M f32 params, bf16 grads, bf16 param copy out
    int64_t n = 256LL << 20;
    auto p = Random(b, {n}, DType::kF32), g = Random(b, {n}, bf), m = Random(b, {n}, DType::kF32, 0.1f);
    auto v = Random(b, {n}, DType::kF32, 0.1f), lowp = *b.Empty({n}, bf);
    AdamWParams hp;
    double ms = TimeMs(b, [&] { return b.AdamW(p, g, m, v, hp, &lowp); });
    Line("adamw", "256M f32 (bf16 grad, bf16 out)", ms, "gbps", (4.0 + 2 + 4 + 4 + 4 + 4 + 4 + 2) * n / ms / 1e6);
  }
  if (Want("rope")) {  // RoPE: 16384 tokens x 32 heads x 64, bf16
    int64_t T = 16384, H = 32, D = 64;
    auto x = Random(b, {T, H, D}, bf), y = *b.Empty({T, H, D}, bf), pos = *b.Empty({T}, DType::kI32);
    std::vector<int32_t> hp(T);
    for (int64_t i = 0; i < T; ++i) hp[i] = static_cast<int32_t>(i);
    (void)b.CopyFromHost(hp.data(), pos);
    std::vector<float> inv_freq(D / 2);
    for (int64_t i = 0; i < D / 2; ++i) inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / D));
    double ms = TimeMs(b, [&] { return b.Rope(x, pos, inv_freq, 1.f, y); }, kShortIters);
    Line("rope", "16384x32x64 bf16", ms, "gbps", (2.0 * T * H * D * 2 + T * 4) / ms / 1e6);
  }
  if (Want("cross_entropy")) {  // Cross-entropy forward (partials of one shard = the full vocab): 4096 x 128256 bf16
    int64_t n = 4096, v = 128256;
    auto z = Random(b, {n, v}, bf), tg = *b.Empty({n}, DType::kI32);
    std::vector<int32_t> ht(n);
    for (int64_t i = 0; i < n; ++i) ht[i] = static_cast<int32_t>((i * 7919) % v);
    (void)b.CopyFromHost(ht.data(), tg);
    auto mx = *b.Empty({n}, DType::kF32), sm = *b.Empty({n}, DType::kF32), dt = *b.Empty({n}, DType::kF32),
         tt = *b.Empty({n}, DType::kF32);
    double ms = TimeMs(b, [&] { return b.CrossEntropyPartials(z, tg, 0, mx, sm, dt, tt); });
    Line("cross_entropy_fwd", "4096x128256 bf16", ms, "gbps", 1.0 * n * v * 2 / ms / 1e6);
    auto lse = Random(b, {n}, DType::kF32), dl = Random(b, {n}, DType::kF32), dz = *b.Empty({n, v}, bf);
    ms = TimeMs(b, [&] { return b.CrossEntropyBackward(z, tg, 0, lse, dl, dz); });
    Line("cross_entropy_bwd", "4096x128256 bf16", ms, "gbps", 2.0 * n * v * 2 / ms / 1e6);
  }
  if (Want("paged_decode")) {  // Paged decode: 64 sequences x 4096 cached tokens, 32 q heads, 8 kv heads, dim 128, blocks of 16
    int64_t B = 64, ctx = 4096, hq = 32, hkv = 8, D = 128, bs = 16, maxb = ctx / bs, blocks = B * maxb;
    auto q = Random(b, {B, hq, D}, bf), kc = Random(b, {blocks, bs, hkv, D}, bf), vc = Random(b, {blocks, bs, hkv, D}, bf);
    auto bt = *b.Empty({B, maxb}, DType::kI32), cl = *b.Empty({B}, DType::kI32);
    std::vector<int32_t> tables(B * maxb), lens(B, static_cast<int32_t>(ctx));
    for (int64_t i = 0; i < B * maxb; ++i) tables[i] = static_cast<int32_t>((i * 48271) % blocks);  // scattered blocks
    (void)b.CopyFromHost(tables.data(), bt);
    (void)b.CopyFromHost(lens.data(), cl);
    auto out = *b.Empty({B, hq, D}, bf), lse = *b.Empty({B, hq}, DType::kF32);
    // Host tables and lengths (the rollout engine's path: validated without a device round
    // trip), then device ones (validation copies them back: one wait per call).
    auto host = MakeCpuBackend();
    auto hbt = *host->Empty({B, maxb}, DType::kI32), hcl = *host->Empty({B}, DType::kI32);
    std::copy(tables.begin(), tables.end(), hbt.data_as<int32_t>());
    std::copy(lens.begin(), lens.end(), hcl.data_as<int32_t>());
    const double bytes = 2.0 * B * ctx * hkv * D * 2;
    double ms = TimeMs(b, [&] { return b.PagedAttention(q, kc, vc, hbt, hcl, out, lse); }, 20, 3);
    Line("paged_decode", "64x4096 ctx, 32/8 heads, d128 bf16", ms, "gbps", bytes / ms / 1e6);
    ms = TimeMs(b, [&] { return b.PagedAttention(q, kc, vc, bt, cl, out, lse); }, 20, 3);
    Line("paged_decode_devtables", "same, tables on the device", ms, "gbps", bytes / ms / 1e6);
  }
  // The decode step's linear layers (Backend::DecodeLinear) at the ~1B Llama shape, over
  // 16 layers of distinct weights (2 GB: the weights come from HBM, not L2), as one CUDA
  // graph per case: each kind of layer alone, 16 of them back to back, then the 4 of a
  // layer in their order (q|k|v with the input norm, o + residual, gate|up with the norm
  // and SwiGLU, down + residual); GB/s of weights read. Past 4 rows (16, 64 and 128) the
  // same layer as RMSNorm, cuBLASLt GEMMs and SwiGLU (the "_cublaslt" rows: the model's path
  // there), beside the fused rows where DecodeLinear takes the size (with
  // TESSERA_DECODE_GEMM=1, the tensor-core decode GEMM on Hopper). Beside them the
  // device-to-device copy bandwidth of 1 GiB, the roofline the decode rows are measured against.
  if (Want("decode_linear")) {
    const int64_t H = 2048, KV = 512, F = 8192, L = 16, V = 128256;
    {
      const int64_t n = 1LL << 29;
      auto src = Random(b, {n}, bf), dst = *b.Empty({n}, bf);
      auto copy = [&] {
        return cudaMemcpyAsync(dst.data(), src.data(), n * 2, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(b.stream())) ==
                       cudaSuccess
                   ? absl::OkStatus()
                   : absl::InternalError("copy");
      };
      double ms = TimeMs(b, copy, 20, 3);
      Line("copy_d2d", "1 GiB", ms, "gbps", 2.0 * n * 2 / ms / 1e6);
    }
    struct Layer {
      Tensor q, k, v, o, gate, up, down, norm1, norm2;
    };
    // Weights of one byte pattern (0x1c1c: bf16 ~5e-22, finite through the chain): the
    // time does not depend on the values, and 2 GB of host random numbers would be slow.
    auto W = [&](std::vector<int64_t> shape) {
      auto t = *b.Empty(shape, bf);
      (void)b.Fill(t, 0x1c);
      return t;
    };
    std::vector<Layer> layers;
    for (int64_t l = 0; l < L; ++l)
      layers.push_back({W({H, H}), W({KV, H}), W({KV, H}), W({H, H}), W({F, H}), W({F, H}), W({H, F}), Random(b, {H}, bf),
                        Random(b, {H}, bf)});
    auto lm = W({V, H});
    for (int64_t m : {1, 4, 16, 64, 128}) {
      auto x = Random(b, {m, H}, bf), h = Random(b, {m, H}, bf), qo = *b.Empty({m, H}, bf), ko = *b.Empty({m, KV}, bf);
      auto vo = *b.Empty({m, KV}, bf), act = *b.Empty({m, F}, bf), logits = *b.Empty({m, V}, bf);
      auto qkv = [&](Layer& w) {
        Backend::LinearPart p[3] = {{&w.q, nullptr, &qo}, {&w.k, nullptr, &ko}, {&w.v, nullptr, &vo}};
        return b.DecodeLinear(x, &w.norm1, 1e-5f, p, nullptr, false);
      };
      auto o = [&](Layer& w) {
        Backend::LinearPart p[1] = {{&w.o, nullptr, &h}};
        return b.DecodeLinear(qo, nullptr, 0.f, p, &x, false);
      };
      auto gate_up = [&](Layer& w) {
        Backend::LinearPart p[2] = {{&w.gate, nullptr, &act}, {&w.up, nullptr, nullptr}};
        return b.DecodeLinear(h, &w.norm2, 1e-5f, p, nullptr, true);
      };
      auto down = [&](Layer& w) {
        Backend::LinearPart p[1] = {{&w.down, nullptr, &x}};
        return b.DecodeLinear(act, nullptr, 0.f, p, &h, false);
      };
      // The peer: the same layer unfused, as the model runs it where DecodeLinear does not
      // take the size — RMSNorm, cuBLASLt GEMMs (q, k, v and gate, up at once; the residual
      // in the epilogue), SwiGLU.
      auto xn = *b.Empty({m, H}, bf), rstd = *b.Empty({m}, DType::kF32), g = *b.Empty({m, F}, bf), u = *b.Empty({m, F}, bf);
      auto qkv_g = [&](Layer& w) -> absl::Status {
        TESSERA_RETURN_IF_ERROR(b.RmsNormForward(x, w.norm1, 1e-5f, xn, rstd));
        const Backend::GemmCall c[3] = {{&xn, false, &w.q, true, &qo}, {&xn, false, &w.k, true, &ko}, {&xn, false, &w.v, true, &vo}};
        return b.Gemms(c);
      };
      auto o_g = [&](Layer& w) { return b.Gemm(qo, false, w.o, true, h, 1.f, 1.f, &x); };
      auto gate_up_g = [&](Layer& w) -> absl::Status {
        TESSERA_RETURN_IF_ERROR(b.RmsNormForward(h, w.norm2, 1e-5f, xn, rstd));
        const Backend::GemmCall c[2] = {{&xn, false, &w.gate, true, &g}, {&xn, false, &w.up, true, &u}};
        TESSERA_RETURN_IF_ERROR(b.Gemms(c));
        return b.SwiGluForward(g, u, act);
      };
      auto down_g = [&](Layer& w) { return b.Gemm(act, false, w.down, true, x, 1.f, 1.f, &h); };
      using Op = std::function<absl::Status(Layer&)>;
      struct Case {
        const char* name;
        std::vector<Op> ops;
        int64_t bytes_per_layer;
      };
      const int64_t qkv_b = (H + 2 * KV) * H * 2, o_b = H * H * 2, gu_b = 2 * F * H * 2, d_b = F * H * 2;
      const bool fused = b.DecodeLinearSupported(m, H, bf) && b.DecodeLinearSupported(m, F, bf);
      std::vector<Case> cases;
      if (fused)
        cases = {{"qkv", {qkv}, qkv_b}, {"o", {o}, o_b}, {"gate_up", {gate_up}, gu_b}, {"down", {down}, d_b},
                 {"layer", {qkv, o, gate_up, down}, qkv_b + o_b + gu_b + d_b}};
      if (!fused || m > tessera::kernels::kDecodeCudaMaxRows)  // the default path past 4 rows
        for (Case c : std::vector<Case>{{"qkv_cublaslt", {qkv_g}, qkv_b}, {"o_cublaslt", {o_g}, o_b},
                                        {"gate_up_cublaslt", {gate_up_g}, gu_b}, {"down_cublaslt", {down_g}, d_b},
                                        {"layer_cublaslt", {qkv_g, o_g, gate_up_g, down_g}, qkv_b + o_b + gu_b + d_b}})
          cases.push_back(c);
      for (const Case& c : cases) {
        absl::Status st = b.BeginCapture();
        for (int64_t l = 0; l < L && st.ok(); ++l)
          for (const Op& op : c.ops)
            if (st.ok()) st = op(layers[l]);
        auto graph = b.EndCapture();
        if (!st.ok() || !graph.ok()) {
          fprintf(stderr, "decode_linear %s: %s\n", c.name, (st.ok() ? graph.status() : st).ToString().c_str());
          continue;
        }
        double ms = TimeMs(b, [&] { return (*graph)->Launch(); }, 50, 5);
        Line((std::string("decode_linear_") + c.name + "_m" + std::to_string(m)).c_str(),
             "m" + std::to_string(m) + ", 16 layers, " + std::to_string(c.ops.size() * L) + " calls", ms, "gbps",
             double(c.bytes_per_layer) * L / ms / 1e6);
      }
      if (!fused) continue;  // the rows below are of the fused linears
      // The whole layer of a decode step over a KV cache of 256 tokens per row: q|k|v, the
      // q/k RoPE and cache write, paged attention, o, gate|up, down (GB/s of weights and
      // KV read). Against decode_linear_layer: what the attention's two kernels cost; "fused":
      // the q/k pass inside the attention (Backend::DecodeAttention), one kernel; "fused_alloc":
      // that layer with its temporaries allocated inside the capture, as the model does. Each
      // row's detail gives its graph's kernels, programmatic edges and memory nodes.
      {
        const int64_t ctx = 256, bs = 16, D = 64, hq = H / D, hkv = KV / D, maxb = ctx / bs;
        auto kc = W({m * maxb * L, bs, hkv, D}), vc = W({m * maxb * L, bs, hkv, D});
        auto q3 = *qo.Reshape({m, hq, D}), k3 = *ko.Reshape({m, hkv, D}), v3 = *vo.Reshape({m, hkv, D});
        auto qr = *b.Empty({m, hq, D}, bf), att = *b.Empty({m, hq, D}, bf), lse = *b.Empty({m, hq}, DType::kF32);
        auto att2 = *att.Reshape({m, H});
        std::vector<Tensor> tables, slots;
        auto pos = *b.Empty({m}, DType::kI32), lens = *b.Empty({m}, DType::kI32);
        std::vector<int32_t> hp(m, int32_t(ctx - 1)), hl(m, int32_t(ctx));
        (void)b.CopyFromHost(hp.data(), pos), (void)b.CopyFromHost(hl.data(), lens);
        for (int64_t l = 0; l < L; ++l) {  // each layer its own blocks (as its own cache)
          std::vector<int32_t> ht(m * maxb), hs(m);
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t j = 0; j < maxb; ++j) ht[r * maxb + j] = int32_t((l * m + r) * maxb + j);
            hs[r] = ht[r * maxb + maxb - 1] * int32_t(bs) + int32_t(bs - 1);
          }
          tables.push_back(*b.Empty({m, maxb}, DType::kI32)), slots.push_back(*b.Empty({m}, DType::kI32));
          (void)b.CopyFromHost(ht.data(), tables.back()), (void)b.CopyFromHost(hs.data(), slots.back());
        }
        std::vector<float> inv_freq(D / 2);
        for (int64_t i = 0; i < D / 2; ++i) inv_freq[i] = float(std::pow(500000.0, -2.0 * i / D));
        for (bool fused : {false, true}) {  // the q/k pass before the attention, or inside it
          b.set_trust_device_indices(true);
          absl::Status st = b.BeginCapture();
          for (int64_t l = 0; l < L && st.ok(); ++l) {
            Layer& w = layers[l];
            st = qkv(w);
            if (st.ok() && fused)
              st = b.DecodeAttention(q3, k3, v3, pos, slots[l], nullptr, nullptr, 1e-5f, inv_freq, 1.f, qr, kc, vc, tables[l], lens, att, lse);
            if (st.ok() && !fused) st = b.QkRopeCache(q3, k3, v3, pos, slots[l], nullptr, nullptr, 1e-5f, inv_freq, 1.f, qr, kc, vc);
            if (st.ok() && !fused) st = b.PagedAttention(qr, kc, vc, tables[l], lens, att, lse);
            Backend::LinearPart po[1] = {{&w.o, nullptr, &h}};
            if (st.ok()) st = b.DecodeLinear(att2, nullptr, 0.f, po, &x, false);
            if (st.ok()) st = gate_up(w);
            if (st.ok() && b.DecodeLinearSupported(m, F, bf)) st = down(w);
          }
          auto graph = b.EndCapture();
          b.set_trust_device_indices(false);
          if (!st.ok() || !graph.ok()) {
            fprintf(stderr, "decode_layer_attention: %s\n", (st.ok() ? graph.status() : st).ToString().c_str());
          } else {
            const bool with_down = b.DecodeLinearSupported(m, F, bf);
            const double bytes = double(qkv_b + o_b + gu_b + (with_down ? d_b : 0) + 2 * m * ctx * KV * 2) * L;
            double ms = TimeMs(b, [&] { return (*graph)->Launch(); }, 50, 5);
            Line(((fused ? "decode_layer_attention_fused_m" : "decode_layer_attention_m") + std::to_string(m)).c_str(),
                 "m" + std::to_string(m) + ", 16 layers, ctx 256" + (with_down ? "" : ", no down") + GraphShape(**graph), ms, "gbps",
                 bytes / ms / 1e6);
          }
        }
        // The fused layer again with its temporaries made inside the capture, as the model's
        // decode step makes them (from the backend's capture arena, freed after the layer):
        // against the row above, what making them costs — nothing, when the graph keeps the
        // preallocated row's programmatic edges (the row's detail counts them).
        if (b.DecodeLinearSupported(m, F, bf)) {
          b.set_trust_device_indices(true);
          absl::Status st = b.BeginCapture();
          Tensor xin = x;
          for (int64_t l = 0; l < L && st.ok(); ++l) {
            Layer& w = layers[l];
            auto qo_l = *b.Empty({m, H}, bf), ko_l = *b.Empty({m, KV}, bf), vo_l = *b.Empty({m, KV}, bf);
            Backend::LinearPart pq[3] = {{&w.q, nullptr, &qo_l}, {&w.k, nullptr, &ko_l}, {&w.v, nullptr, &vo_l}};
            st = b.DecodeLinear(xin, &w.norm1, 1e-5f, pq, nullptr, false);
            auto qr_l = *b.Empty({m, hq, D}, bf), att_l = *b.Empty({m, hq, D}, bf), lse_l = *b.Empty({m, hq}, DType::kF32);
            if (st.ok())
              st = b.DecodeAttention(*qo_l.Reshape({m, hq, D}), *ko_l.Reshape({m, hkv, D}), *vo_l.Reshape({m, hkv, D}), pos, slots[l],
                                     nullptr, nullptr, 1e-5f, inv_freq, 1.f, qr_l, kc, vc, tables[l], lens, att_l, lse_l);
            auto h_l = *b.Empty({m, H}, bf);
            Backend::LinearPart po[1] = {{&w.o, nullptr, &h_l}};
            if (st.ok()) st = b.DecodeLinear(*att_l.Reshape({m, H}), nullptr, 0.f, po, &xin, false);
            auto act_l = *b.Empty({m, F}, bf);
            Backend::LinearPart pg[2] = {{&w.gate, nullptr, &act_l}, {&w.up, nullptr, nullptr}};
            if (st.ok()) st = b.DecodeLinear(h_l, &w.norm2, 1e-5f, pg, nullptr, true);
            auto x_l = *b.Empty({m, H}, bf);
            Backend::LinearPart pd[1] = {{&w.down, nullptr, &x_l}};
            if (st.ok()) st = b.DecodeLinear(act_l, nullptr, 0.f, pd, &h_l, false);
            xin = x_l;
          }
          xin = Tensor();
          auto graph = b.EndCapture();
          b.set_trust_device_indices(false);
          if (!st.ok() || !graph.ok()) {
            fprintf(stderr, "decode_layer_attention_fused_alloc: %s\n", (st.ok() ? graph.status() : st).ToString().c_str());
          } else {
            const double bytes = double(qkv_b + o_b + gu_b + d_b + 2 * m * ctx * KV * 2) * L;
            double ms = TimeMs(b, [&] { return (*graph)->Launch(); }, 50, 5);
            Line(("decode_layer_attention_fused_alloc_m" + std::to_string(m)).c_str(),
                 "m" + std::to_string(m) + ", 16 layers, ctx 256, temporaries made in the capture" + GraphShape(**graph), ms, "gbps",
                 bytes / ms / 1e6);
          }
        }
      }
      Backend::LinearPart p[1] = {{&lm, nullptr, &logits}};
      double ms = TimeMs(b, [&] { return b.DecodeLinear(x, &layers[0].norm1, 1e-5f, p, nullptr, false); }, 50, 5);
      Line(("decode_linear_lm_head_m" + std::to_string(m)).c_str(), "m" + std::to_string(m) + ", 128256x2048", ms, "gbps", double(V) * H * 2 / ms / 1e6);
    }
  }
  // Attention: 16384 tokens packed as sequences of S (cu_seqlens), MHA, as in the peer.
  if (Want("attn")) for (auto [D, H] : {std::pair<int64_t, int64_t>{64, 32}, {128, 16}}) {
    for (int64_t S : {1024, 4096, 16384}) {
      const int64_t T = 16384, B = T / S;
      auto q = Random(b, {T, H, D}, bf), k = Random(b, {T, H, D}, bf), v = Random(b, {T, H, D}, bf);
      auto g = Random(b, {T, H, D}, bf), out = *b.Empty({T, H, D}, bf), lse = *b.Empty({T, H}, DType::kF32);
      auto dq = *b.Empty({T, H, D}, bf), dk = *b.Empty({T, H, D}, bf), dv = *b.Empty({T, H, D}, bf);
      // cu_seqlens on the host, as the engine passes it: validation needs no device round trip.
      auto host = MakeCpuBackend();
      auto cu = *host->Empty({B + 1}, DType::kI32);
      for (int64_t i = 0; i <= B; ++i) cu.data_as<int32_t>()[i] = static_cast<int32_t>(i * S);
      for (bool causal : {true, false}) {
        const double flops = 4.0 * B * S * S * H * D * (causal ? 0.5 : 1.0);
        const std::string tag = "d" + std::to_string(D) + " s" + std::to_string(S) + (causal ? " c" : " n");
        const std::string shape = "B" + std::to_string(B) + " S" + std::to_string(S) + " H" + std::to_string(H) + " D" +
                                  std::to_string(D) + (causal ? " causal" : " full");
        double ms = TimeMs(b, [&] { return b.AttentionForward(q, k, v, cu, causal, out, lse); }, 10, 2);
        Line(("attn_fwd " + tag).c_str(), shape, ms, "tflops", flops / ms / 1e9);
        ms = TimeMs(b, [&] {
          auto st = b.AttentionForward(q, k, v, cu, causal, out, lse);
          return st.ok() ? b.AttentionBackward(q, k, v, cu, causal, out, g, lse, dq, dk, dv) : st;
        }, 10, 2);
        Line(("attn_fwdbwd " + tag).c_str(), shape, ms, "tflops", 3.5 * flops / ms / 1e9);
      }
    }
  }
  // One ~1B-Llama layer's attention (Llama 3.2 1B: one 4096-token sequence, 32 query and 8
  // kv heads, d64, causal): the backward alone, as the training step runs it (GQA and a
  // single sequence give few, unequal CTAs — what the backward's CTA order is about).
  if (Want("attn")) {
    const int64_t T = 4096, Hq = 32, Hkv = 8, D = 64;
    auto q = Random(b, {T, Hq, D}, bf), k = Random(b, {T, Hkv, D}, bf), v = Random(b, {T, Hkv, D}, bf);
    auto g = Random(b, {T, Hq, D}, bf), out = *b.Empty({T, Hq, D}, bf), lse = *b.Empty({T, Hq}, DType::kF32);
    auto dq = *b.Empty({T, Hq, D}, bf), dk = *b.Empty({T, Hkv, D}, bf), dv = *b.Empty({T, Hkv, D}, bf);
    auto host = MakeCpuBackend();
    auto cu = *host->Empty({2}, DType::kI32);
    cu.data_as<int32_t>()[0] = 0, cu.data_as<int32_t>()[1] = static_cast<int32_t>(T);
    const double flops = 4.0 * T * T * Hq * D * 0.5;
    if (absl::Status st = b.AttentionForward(q, k, v, cu, true, out, lse); !st.ok()) {
      fprintf(stderr, "attn_bwd_1b_layer: %s\n", st.ToString().c_str());
    } else {
      double ms = TimeMs(b, [&] { return b.AttentionBackward(q, k, v, cu, true, out, g, lse, dq, dk, dv); }, 20, 3);
      Line("attn_bwd_1b_layer", "S4096 Hq32 Hkv8 D64 causal", ms, "tflops", 2.5 * flops / ms / 1e9);
    }
  }
  // The forward's two engines side by side (kernels::AttentionEngine), at the sequence
  // lengths around the auto threshold (kCudnnMaxAutoSeq): what the threshold is set from.
  if (Want("attn")) {
    fprintf(stderr, "attention engines: %s\n", tessera::kernels::cudnn_attention::Describe().c_str());
    for (auto [D, H] : {std::pair<int64_t, int64_t>{64, 32}, {128, 16}})
      for (int64_t S : {1024, 2048, 4096, 16384}) {
        const int64_t T = 16384, B = T / S;
        auto q = Random(b, {T, H, D}, bf), k = Random(b, {T, H, D}, bf), v = Random(b, {T, H, D}, bf);
        auto out = *b.Empty({T, H, D}, bf), lse = *b.Empty({T, H}, DType::kF32);
        auto host = MakeCpuBackend();
        auto cu = *host->Empty({B + 1}, DType::kI32);
        for (int64_t i = 0; i <= B; ++i) cu.data_as<int32_t>()[i] = static_cast<int32_t>(i * S);
        for (bool causal : {true, false}) {
          const double flops = 4.0 * B * S * S * H * D * (causal ? 0.5 : 1.0);
          const std::string tag = "d" + std::to_string(D) + " s" + std::to_string(S) + (causal ? " c" : " n");
          for (auto [e, name] : {std::pair{tessera::kernels::AttentionEngine::kFlash, "flash"},
                                 std::pair{tessera::kernels::AttentionEngine::kCudnn, "cudnn"}}) {
            b.set_attention_engine(e);
            double ms = TimeMs(b, [&] { return b.AttentionForward(q, k, v, cu, causal, out, lse); }, 10, 2);
            Line(("engine_fwd_" + std::string(name) + " " + tag).c_str(), "16384 tokens", ms, "tflops", flops / ms / 1e9);
          }
          b.set_attention_engine(tessera::kernels::AttentionEngine::kAuto);
        }
      }
  }
  struct G { const char* name; int64_t m, n, k; };
  // Llama-3.2-1B shapes at 8192 tokens: y = x @ W^T with W stored [out, in].
  if (Want("gemm")) for (G g : {G{"gemm_qkv", 8192, 3072, 2048}, G{"gemm_o", 8192, 2048, 2048}, G{"gemm_gate_up", 8192, 16384, 2048},
              G{"gemm_down", 8192, 2048, 8192}, G{"gemm_lm_head", 8192, 128256, 2048}}) {
    auto a = Random(b, {g.m, g.k}, bf), w = Random(b, {g.n, g.k}, bf, 0.02f), c = *b.Empty({g.m, g.n}, bf);
    double ms = TimeMs(b, [&] { return b.Gemm(a, false, w, true, c); });
    Line(g.name, std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k) + " bf16", ms, "tflops",
         2.0 * g.m * g.n * g.k / ms / 1e9);
  }
  // The 1B training step's GEMMs per micro-batch (4096 tokens, weights [out, in]): forward
  // y = x W^T, dgrad dx = dy W (bf16 out), wgrad dW += dy^T x into the f32 gradient (beta 1:
  // the accumulation), for TESSERA_GEMM_TUNE A/B (run this mode with and without it).
  struct W { const char* name; int64_t out, in; };
  if (Want("gemm_train"))
    // The *_fused rows are not in the model: q|k|v and gate|up as one GEMM each, to show
    // what fusing the projections would save (against q_o + 2 k_v, and 2 gate_up).
    for (W w : {W{"q_o", 2048, 2048}, W{"k_v", 512, 2048}, W{"gate_up", 8192, 2048}, W{"down", 2048, 8192},
                W{"lm_head", 128256, 2048}, W{"qkv_fused", 3072, 2048}, W{"kv_fused", 1024, 2048},
                W{"gate_up_fused", 16384, 2048}}) {
      const int64_t T = 4096;
      auto x = Random(b, {T, w.in}, bf), wt = Random(b, {w.out, w.in}, bf, 0.02f), dy = Random(b, {T, w.out}, bf);
      auto y = *b.Empty({T, w.out}, bf), dx = *b.Empty({T, w.in}, bf), dw = *b.Empty({w.out, w.in}, DType::kF32);
      (void)b.Fill(dw, 0);
      const double flops = 2.0 * T * w.out * w.in;
      const std::string shape = std::to_string(T) + "x" + std::to_string(w.out) + "x" + std::to_string(w.in);
      double ms = TimeMs(b, [&] { return b.Gemm(x, false, wt, true, y); });
      Line((std::string("gemm_fwd_") + w.name).c_str(), shape + " bf16", ms, "tflops", flops / ms / 1e9);
      ms = TimeMs(b, [&] { return b.Gemm(dy, false, wt, false, dx); });
      Line((std::string("gemm_dgrad_") + w.name).c_str(), shape + " bf16", ms, "tflops", flops / ms / 1e9);
      ms = TimeMs(b, [&] { return b.Gemm(dy, true, x, false, dw, 1.f, 1.f); });
      Line((std::string("gemm_wgrad_") + w.name).c_str(), shape + " bf16->f32 +=", ms, "tflops", flops / ms / 1e9);
    }
  return 0;
}
