// Attention, paged decode and sampling ops in the op harness (see op_test.cc for the
// tolerances that are not written next to their checks).
#include "absl/strings/str_cat.h"
#include "tests/kernels/op_harness.h"

namespace tessera::runtime::test {
namespace {

void AttentionRef(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                  const std::vector<int32_t>& cu, int64_t hq, int64_t hkv, int64_t dim, bool causal,
                  std::vector<double>& out, std::vector<double>& lse) {
  int64_t T = cu.back();
  out.assign(T * hq * dim, 0.0);
  lse.assign(T * hq, 0.0);
  double scale = 1.0 / std::sqrt(double(dim));
  for (size_t b = 0; b + 1 < cu.size(); ++b)
    for (int64_t h = 0; h < hq; ++h) {
      int64_t g = h / (hq / hkv);
      for (int64_t i = cu[b]; i < cu[b + 1]; ++i) {
        std::vector<double> sc;
        for (int64_t j = cu[b]; j < cu[b + 1]; ++j) {
          if (causal && j > i) break;
          double dot = 0;
          for (int64_t c = 0; c < dim; ++c) dot += double(q[(i * hq + h) * dim + c]) * k[(j * hkv + g) * dim + c];
          sc.push_back(dot * scale);
        }
        double m = *std::max_element(sc.begin(), sc.end()), z = 0;
        for (double x : sc) z += std::exp(x - m);
        lse[i * hq + h] = m + std::log(z);
        for (size_t jj = 0; jj < sc.size(); ++jj)
          for (int64_t c = 0; c < dim; ++c)
            out[(i * hq + h) * dim + c] += std::exp(sc[jj] - m) / z * v[((cu[b] + jj) * hkv + g) * dim + c];
      }
    }
}

TEST_P(OpTest, AttentionForwardVarlenGqaCausal) {
  Rng rng(seed_);
  struct C { std::vector<int32_t> lens; int64_t hq, hkv, dim; };
  for (DType t : {DType::kF32, DType::kBF16}) {
    // Flash path (bf16, d 64/128): tiles of 128 queries x 64 keys, so 130, 200 and 300 cross
    // tile edges inside and between packed sequences.
    for (C c : {C{{1}, 1, 1, 8}, C{{3, 5}, 4, 2, 64}, C{{7, 1, 16}, 8, 1, 128}, C{{130}, 2, 2, 64},
                C{{200, 77, 300}, 4, 2, 64}, C{{130, 1, 200}, 4, 1, 128}}) {
      for (bool causal : {true, false}) {
        std::vector<int32_t> cu = {0};
        for (int32_t l : c.lens) cu.push_back(cu.back() + l);
        int64_t T = cu.back();
        SCOPED_TRACE(::testing::Message() << DTypeName(t) << " T=" << T << " hq=" << c.hq << " hkv=" << c.hkv << " d=" << c.dim
                                          << " causal=" << causal << " seed=" << seed_);
        auto qv = Quantize(rng.Normal(T * c.hq * c.dim), t), kv = Quantize(rng.Normal(T * c.hkv * c.dim), t),
             vv = Quantize(rng.Normal(T * c.hkv * c.dim), t);
        auto q = Make(*be_, {T, c.hq, c.dim}, t, qv), k = Make(*be_, {T, c.hkv, c.dim}, t, kv),
             v = Make(*be_, {T, c.hkv, c.dim}, t, vv), cut = Ints(*be_, cu);
        auto out = Out(*be_, {T, c.hq, c.dim}, t), lse = Out(*be_, {T, c.hq}, DType::kF32);
        auto st = be_->AttentionForward(q, k, v, cut, causal, out, lse);
        ASSERT_TRUE(st.ok()) << st;
        std::vector<double> ro, rl;
        AttentionRef(qv, kv, vv, cu, c.hq, c.hkv, c.dim, causal, ro, rl);
        EXPECT_LT(RelErr(Read(*be_, out), ro), t == DType::kBF16 ? 2e-2 : (cpu() ? 1e-6 : 1e-5));
        EXPECT_LT(RelErr(Read(*be_, lse), rl), cpu() ? 1e-6 : 1e-5);
      }
    }
  }
}

// Ring attention's merge: attention of queries over keys K1 and over K2, merged, equals
// attention over [K1; K2] (the reference: double precision over the concatenated keys).
// Rows whose second block is empty (lse -inf) keep the first block's values.
TEST_P(OpTest, AttentionMergeEqualsAttentionOverBothBlocks) {
  Rng rng(seed_);
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (auto [T, hq, hkv, dim] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 1, 1, 8}, {37, 4, 2, 64}, {130, 2, 1, 128}}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << " T=" << T << " d=" << dim << " seed=" << seed_);
      auto qv = Quantize(rng.Normal(T * hq * dim), t);
      std::vector<float> kb[2], vb[2];
      for (int i = 0; i < 2; ++i) kb[i] = Quantize(rng.Normal(T * hkv * dim), t), vb[i] = Quantize(rng.Normal(T * hkv * dim), t);
      auto q = Make(*be_, {T, hq, dim}, t, qv);
      auto cu = Ints(*be_, {0, static_cast<int32_t>(T)});
      Tensor out[2], lse[2];
      for (int i = 0; i < 2; ++i) {
        auto k = Make(*be_, {T, hkv, dim}, t, kb[i]), v = Make(*be_, {T, hkv, dim}, t, vb[i]);
        out[i] = Out(*be_, {T, hq, dim}, t), lse[i] = Out(*be_, {T, hq}, DType::kF32);
        ASSERT_TRUE(be_->AttentionForward(q, k, v, cu, false, out[i], lse[i]).ok());
      }
      ASSERT_TRUE(be_->AttentionMerge(out[0], lse[0], out[1], lse[1]).ok());
      // Reference: the queries twice over the 2T keys, non-causal; the first T rows.
      std::vector<float> q2 = qv, k2 = kb[0], v2 = vb[0];
      q2.insert(q2.end(), qv.begin(), qv.end());
      k2.insert(k2.end(), kb[1].begin(), kb[1].end());
      v2.insert(v2.end(), vb[1].begin(), vb[1].end());
      std::vector<double> ro, rl;
      AttentionRef(q2, k2, v2, {0, static_cast<int32_t>(2 * T)}, hq, hkv, dim, false, ro, rl);
      ro.resize(T * hq * dim);
      rl.resize(T * hq);
      EXPECT_LT(RelErr(Read(*be_, out[0]), ro), t == DType::kBF16 ? 2e-2 : (cpu() ? 1e-6 : 1e-5));
      // The lse relative to max(|lse|, 1) per row: with one row (T=1) an lse near 0 made a
      // plain relative error of f32 rounding fail now and then (2.8e-6).
      const std::vector<float> got_lse = Read(*be_, lse[0]);
      double err = 0, size = 0;
      for (size_t i = 0; i < rl.size(); ++i) err += (got_lse[i] - rl[i]) * (got_lse[i] - rl[i]), size += std::max(rl[i] * rl[i], 1.0);
      EXPECT_LT(std::sqrt(err / size), cpu() ? 1e-6 : 1e-5);
      // An empty block (lse -inf everywhere) changes nothing.
      auto before = Read(*be_, out[0]);
      std::vector<float> ninf(T * hq, -INFINITY);
      auto empty_lse = Make(*be_, {T, hq}, DType::kF32, ninf);
      ASSERT_TRUE(be_->AttentionMerge(out[0], lse[0], out[1], empty_lse).ok());
      EXPECT_EQ(Read(*be_, out[0]), before);
    }
  }
  // Shapes are checked.
  auto a = Out(*be_, {4, 2, 8}, DType::kF32), l = Out(*be_, {4, 2}, DType::kF32), b = Out(*be_, {4, 2, 4}, DType::kF32);
  EXPECT_FALSE(be_->AttentionMerge(a, l, b, l).ok());
}

TEST_P(OpTest, AttentionBackward) {
  Rng rng(seed_);
  const std::vector<int32_t> cu = {0, 3, 7};
  const int64_t T = 7, hq = 2, hkv = 1, dim = 4;
  auto qv = rng.Normal(T * hq * dim), kv = rng.Normal(T * hkv * dim), vv = rng.Normal(T * hkv * dim), rv = rng.Normal(T * hq * dim);
  auto q = Make(*be_, {T, hq, dim}, DType::kF32, qv), k = Make(*be_, {T, hkv, dim}, DType::kF32, kv),
       v = Make(*be_, {T, hkv, dim}, DType::kF32, vv), cut = Ints(*be_, cu), dout = Make(*be_, {T, hq, dim}, DType::kF32, rv);
  auto out = Out(*be_, {T, hq, dim}, DType::kF32), lse = Out(*be_, {T, hq}, DType::kF32);
  ASSERT_TRUE(be_->AttentionForward(q, k, v, cut, true, out, lse).ok());
  auto dq = Out(*be_, {T, hq, dim}, DType::kF32), dk = Out(*be_, {T, hkv, dim}, DType::kF32), dv = Out(*be_, {T, hkv, dim}, DType::kF32);
  auto st = be_->AttentionBackward(q, k, v, cut, true, out, dout, lse, dq, dk, dv);
  ASSERT_TRUE(st.ok()) << st;
  // Finite differences of L = sum(out * r) through the double reference.
  auto loss = [&](const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c) {
    std::vector<double> o, l;
    AttentionRef(a, b, c, cu, hq, hkv, dim, true, o, l);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * rv[i];
    return s;
  };
  const double h = 1e-3;
  auto fd = [&](int which) {
    std::vector<std::vector<float>> in = {qv, kv, vv};
    std::vector<double> g(in[which].size());
    for (size_t i = 0; i < g.size(); ++i) {
      auto p = in, m = in;
      p[which][i] += h, m[which][i] -= h;
      g[i] = (loss(p[0], p[1], p[2]) - loss(m[0], m[1], m[2])) / (2 * h);
    }
    return g;
  };
  EXPECT_LT(RelErr(Read(*be_, dq), fd(0)), 1e-4) << "seed " << seed_;
  EXPECT_LT(RelErr(Read(*be_, dk), fd(1)), 1e-4) << "seed " << seed_;
  EXPECT_LT(RelErr(Read(*be_, dv), fd(2)), 1e-4) << "seed " << seed_;
}

// CUDA backward (flash for bf16 d 64/128, generic otherwise) against the CPU backward on
// the same inputs (the CPU backward itself is checked by finite differences above).
// Tolerance: f32 1e-4 (__expf and f32 sums over up to 300 keys vs double); bf16 3e-2
// (P and dS are rounded to bf16 before their MMAs, as in FlashAttention-2, on top of
// bf16 outputs).
TEST_P(OpTest, AttentionBackwardMatchesCpu) {
  if (cpu()) GTEST_SKIP() << "the CPU backward is the reference";
  auto ref = MakeCpuBackend();
  Rng rng(seed_);
  struct C { DType t; std::vector<int32_t> lens; int64_t hq, hkv, dim; };
  for (C c : {C{DType::kF32, {3, 5}, 4, 2, 8}, C{DType::kBF16, {5, 3}, 2, 1, 48}, C{DType::kBF16, {1, 70, 130}, 4, 2, 64},
              C{DType::kBF16, {300, 129}, 4, 1, 64}, C{DType::kBF16, {200, 9}, 2, 1, 128},
              C{DType::kBF16, {300}, 2, 2, 128}}) {
    for (bool causal : {true, false}) {
      std::vector<int32_t> cu = {0};
      for (int32_t l : c.lens) cu.push_back(cu.back() + l);
      const int64_t T = cu.back();
      SCOPED_TRACE(::testing::Message() << DTypeName(c.t) << " T=" << T << " hq=" << c.hq << " hkv=" << c.hkv
                                        << " d=" << c.dim << " causal=" << causal << " seed=" << seed_);
      auto qv = Quantize(rng.Normal(T * c.hq * c.dim), c.t), kv = Quantize(rng.Normal(T * c.hkv * c.dim), c.t),
           vv = Quantize(rng.Normal(T * c.hkv * c.dim), c.t), gv = Quantize(rng.Normal(T * c.hq * c.dim), c.t);
      std::vector<std::vector<float>> grads[2];
      for (int side = 0; side < 2; ++side) {
        Backend& b = side == 0 ? *be_ : *ref;
        // cu_seqlens on the host (causal cases) or on the device (the others): both paths.
        auto q = Make(b, {T, c.hq, c.dim}, c.t, qv), k = Make(b, {T, c.hkv, c.dim}, c.t, kv),
             v = Make(b, {T, c.hkv, c.dim}, c.t, vv), g = Make(b, {T, c.hq, c.dim}, c.t, gv),
             cut = Ints(causal ? *ref : b, cu);
        auto out = Out(b, {T, c.hq, c.dim}, c.t), lse = Out(b, {T, c.hq}, DType::kF32);
        ASSERT_TRUE(b.AttentionForward(q, k, v, cut, causal, out, lse).ok());
        auto dq = Out(b, {T, c.hq, c.dim}, c.t), dk = Out(b, {T, c.hkv, c.dim}, c.t), dv = Out(b, {T, c.hkv, c.dim}, c.t);
        auto st = b.AttentionBackward(q, k, v, cut, causal, out, g, lse, dq, dk, dv);
        ASSERT_TRUE(st.ok()) << st;
        grads[side] = {Read(b, dq), Read(b, dk), Read(b, dv)};
      }
      const double tol = c.t == DType::kBF16 ? 3e-2 : 1e-4;
      EXPECT_LT(RelErr(grads[0][0], grads[1][0]), tol) << "dq";
      EXPECT_LT(RelErr(grads[0][1], grads[1][1]), tol) << "dk";
      EXPECT_LT(RelErr(grads[0][2], grads[1][2]), tol) << "dv";
    }
  }
}

// At scale on the GPU: enough (query tile, head) items that every persistent forward CTA
// runs several of them (the K/V ring and the Q hand-over carry across items) and every
// backward CTA loops over many query tiles, checked against the generic f32 kernels on
// the same (bf16-exact) inputs. The CPU reference would take minutes at this size.
TEST_P(OpTest, FlashAttentionAtScaleMatchesGenericF32) {
  if (cpu()) GTEST_SKIP() << "compares two CUDA paths";
  Rng rng(seed_);
  struct C { std::vector<int32_t> lens; int64_t hq, hkv, dim; };
  for (C c : {C{{2048}, 32, 8, 64}, C{{1500, 900}, 16, 16, 128}}) {
    for (bool causal : {false, true}) {
      std::vector<int32_t> cu = {0};
      for (int32_t l : c.lens) cu.push_back(cu.back() + l);
      const int64_t T = cu.back();
      SCOPED_TRACE(::testing::Message() << "T=" << T << " hq=" << c.hq << " hkv=" << c.hkv << " d=" << c.dim
                                        << " causal=" << causal << " seed=" << seed_);
      auto qv = Quantize(rng.Normal(T * c.hq * c.dim), DType::kBF16), kv = Quantize(rng.Normal(T * c.hkv * c.dim), DType::kBF16),
           vv = Quantize(rng.Normal(T * c.hkv * c.dim), DType::kBF16), gv = Quantize(rng.Normal(T * c.hq * c.dim), DType::kBF16);
      std::vector<std::vector<float>> res[2];
      for (DType t : {DType::kBF16, DType::kF32}) {  // flash, then generic
        auto q = Make(*be_, {T, c.hq, c.dim}, t, qv), k = Make(*be_, {T, c.hkv, c.dim}, t, kv),
             v = Make(*be_, {T, c.hkv, c.dim}, t, vv), g = Make(*be_, {T, c.hq, c.dim}, t, gv), cut = Ints(*ref_, cu);
        auto out = Out(*be_, {T, c.hq, c.dim}, t), lse = Out(*be_, {T, c.hq}, DType::kF32);
        ASSERT_TRUE(be_->AttentionForward(q, k, v, cut, causal, out, lse).ok());
        auto dq = Out(*be_, {T, c.hq, c.dim}, t), dk = Out(*be_, {T, c.hkv, c.dim}, t), dv = Out(*be_, {T, c.hkv, c.dim}, t);
        auto st = be_->AttentionBackward(q, k, v, cut, causal, out, g, lse, dq, dk, dv);
        ASSERT_TRUE(st.ok()) << st;
        res[t == DType::kF32] = {Read(*be_, out), Read(*be_, lse), Read(*be_, dq), Read(*be_, dk), Read(*be_, dv)};
      }
      // bf16 outputs and bf16 P/dS inside the flash kernels vs f32 throughout (as in
      // AttentionBackwardMatchesCpu); lse is f32 on both paths.
      const char* names[] = {"out", "lse", "dq", "dk", "dv"};
      for (int i = 0; i < 5; ++i)
        EXPECT_LT(RelErr(res[0][i], res[1][i]), i == 1 ? 1e-5 : 3e-2) << names[i];
    }
  }
}

// cuDNN's fused attention, the forward's second path for sequences of one length
// (kernels/attention/cudnn_attention.h), forced, against the double reference — out and
// lse, with the tolerances of the flash path above — and the flash backward run from its
// out and lse against the CPU backward (so its lse means what ours means). GQA, odd
// lengths, both head dims. On the CPU the engine is ignored (the reference runs).
TEST_P(OpTest, CudnnAttentionForwardMatchesReference) {
  struct C { int64_t batch, len, hq, hkv, dim; };
  Rng rng(seed_);
  be_->set_attention_engine(kernels::AttentionEngine::kCudnn);
  for (C c : {C{3, 256, 4, 2, 64}, C{2, 130, 4, 1, 128}, C{1, 77, 2, 2, 64}}) {
    for (bool causal : {true, false}) {
      std::vector<int32_t> cu = {0};
      for (int64_t b = 0; b < c.batch; ++b) cu.push_back(cu.back() + static_cast<int32_t>(c.len));
      const int64_t T = cu.back();
      const DType t = DType::kBF16;
      SCOPED_TRACE(::testing::Message() << "B=" << c.batch << " S=" << c.len << " hq=" << c.hq << " hkv=" << c.hkv
                                        << " d=" << c.dim << " causal=" << causal << " seed=" << seed_);
      auto qv = Quantize(rng.Normal(T * c.hq * c.dim), t), kv = Quantize(rng.Normal(T * c.hkv * c.dim), t),
           vv = Quantize(rng.Normal(T * c.hkv * c.dim), t), gv = Quantize(rng.Normal(T * c.hq * c.dim), t);
      auto q = Make(*be_, {T, c.hq, c.dim}, t, qv), k = Make(*be_, {T, c.hkv, c.dim}, t, kv),
           v = Make(*be_, {T, c.hkv, c.dim}, t, vv), g = Make(*be_, {T, c.hq, c.dim}, t, gv), cut = Ints(*ref_, cu);
      auto out = Out(*be_, {T, c.hq, c.dim}, t), lse = Out(*be_, {T, c.hq}, DType::kF32);
      auto st = be_->AttentionForward(q, k, v, cut, causal, out, lse);
      ASSERT_TRUE(st.ok()) << st;
      std::vector<double> ro, rl;
      AttentionRef(qv, kv, vv, cu, c.hq, c.hkv, c.dim, causal, ro, rl);
      EXPECT_LT(RelErr(Read(*be_, out), ro), 2e-2);
      EXPECT_LT(RelErr(Read(*be_, lse), rl), cpu() ? 1e-6 : 1e-5);
      auto dq = Out(*be_, {T, c.hq, c.dim}, t), dk = Out(*be_, {T, c.hkv, c.dim}, t), dv = Out(*be_, {T, c.hkv, c.dim}, t);
      st = be_->AttentionBackward(q, k, v, cut, causal, out, g, lse, dq, dk, dv);
      ASSERT_TRUE(st.ok()) << st;
      auto rq = Make(*ref_, {T, c.hq, c.dim}, t, qv), rk = Make(*ref_, {T, c.hkv, c.dim}, t, kv),
           rv = Make(*ref_, {T, c.hkv, c.dim}, t, vv), rg = Make(*ref_, {T, c.hq, c.dim}, t, gv);
      auto rout = Out(*ref_, {T, c.hq, c.dim}, t), rlse = Out(*ref_, {T, c.hq}, DType::kF32);
      ASSERT_TRUE(ref_->AttentionForward(rq, rk, rv, cut, causal, rout, rlse).ok());
      auto rdq = Out(*ref_, {T, c.hq, c.dim}, t), rdk = Out(*ref_, {T, c.hkv, c.dim}, t), rdv = Out(*ref_, {T, c.hkv, c.dim}, t);
      ASSERT_TRUE(ref_->AttentionBackward(rq, rk, rv, cut, causal, rout, rg, rlse, rdq, rdk, rdv).ok());
      EXPECT_LT(RelErr(Read(*be_, dq), Read(*ref_, rdq)), 3e-2) << "dq";
      EXPECT_LT(RelErr(Read(*be_, dk), Read(*ref_, rdk)), 3e-2) << "dk";
      EXPECT_LT(RelErr(Read(*be_, dv), Read(*ref_, rdv)), 3e-2) << "dv";
    }
  }
  if (cpu()) return;
  {  // forced cuDNN refuses what it cannot serve, by name
    auto q = Make(*be_, {5, 2, 64}, DType::kBF16, rng.Normal(5 * 2 * 64)), k = Make(*be_, {5, 2, 64}, DType::kBF16, rng.Normal(5 * 2 * 64));
    auto out = Out(*be_, {5, 2, 64}, DType::kBF16), lse = Out(*be_, {5, 2}, DType::kF32);
    auto uneven = Ints(*ref_, {0, 2, 5});
    EXPECT_THAT(std::string(be_->AttentionForward(q, k, k, uneven, true, out, lse).message()),
                HasSubstr("cuDNN engine needs sequences of one length"));
  }
  // Auto dispatch: equal lengths up to kCudnnMaxAutoSeq whose shape was prepared give
  // cuDNN's result bit for bit; the same shape unprepared, unequal lengths (and device
  // cu_seqlens, whose lengths the host cannot see) the flash kernels'. Plans are cached
  // per device for the process: each run of this test takes a length no run prepared.
  static int32_t runs = 0;
  const int32_t len = 272 + 8 * runs++;
  const int64_t hq = 4, dim = 64;
  for (auto [cu, prepare, want] :
       {std::tuple<std::vector<int32_t>, bool, kernels::AttentionEngine>{{0, len, 2 * len}, false, kernels::AttentionEngine::kFlash},
        {{0, len, 2 * len}, true, kernels::AttentionEngine::kCudnn},
        {{0, len - 72, 2 * len}, true, kernels::AttentionEngine::kFlash}}) {
    const int64_t T = cu.back();
    auto q = Make(*be_, {T, hq, dim}, DType::kBF16, rng.Normal(T * hq * dim)),
         k = Make(*be_, {T, hq, dim}, DType::kBF16, rng.Normal(T * hq * dim));
    auto run = [&](kernels::AttentionEngine e, const Tensor& cut) {
      be_->set_attention_engine(e);
      auto out = Out(*be_, {T, hq, dim}, DType::kBF16), lse = Out(*be_, {T, hq}, DType::kF32);
      EXPECT_TRUE(be_->AttentionForward(q, k, k, cut, true, out, lse).ok());
      auto o = Read(*be_, out), l = Read(*be_, lse);
      o.insert(o.end(), l.begin(), l.end());
      return o;
    };
    auto host = Ints(*ref_, cu);
    be_->set_attention_engine(kernels::AttentionEngine::kAuto);
    if (prepare) {
      ASSERT_TRUE(be_->PrepareAttention(2, cu[1], hq, hq, dim, true, DType::kBF16).ok());
    }
    const auto automatic = run(kernels::AttentionEngine::kAuto, host);
    EXPECT_EQ(automatic, run(want, host)) << "T=" << T << (prepare ? " prepared" : " not prepared");
    if (want == kernels::AttentionEngine::kCudnn && !cpu()) {  // the two engines differ: the check can tell them apart
      EXPECT_NE(automatic, run(kernels::AttentionEngine::kFlash, host));
    }
    EXPECT_EQ(run(kernels::AttentionEngine::kAuto, Ints(*be_, cu)), run(kernels::AttentionEngine::kFlash, host));
  }
}

// The auto dispatch builds plans for at most kCudnnMaxAutoPlans shapes per device: of 40
// new shapes prepared, the last gets none and its forward is the flash kernels' bit for
// bit; a forced cuDNN forward still builds its plan past the bound.
TEST_P(OpTest, AutoCudnnPlansAreBoundedPerDevice) {
  if (cpu()) GTEST_SKIP() << "the CPU has one attention";
  const int64_t hq = 2, dim = 64;
  Rng rng(seed_);
  auto run = [&](kernels::AttentionEngine e, int32_t len) {
    be_->set_attention_engine(e);
    auto q = Make(*be_, {len, hq, dim}, DType::kBF16, Quantize(rng.Normal(len * hq * dim), DType::kBF16));
    auto out = Out(*be_, {len, hq, dim}, DType::kBF16), lse = Out(*be_, {len, hq}, DType::kF32);
    EXPECT_TRUE(be_->AttentionForward(q, q, q, Ints(*ref_, {0, len}), true, out, lse).ok());
    return Read(*be_, out);
  };
  static int32_t base = 1000;  // lengths no other test prepares
  const int32_t first = base;
  base += 48;
  be_->set_attention_engine(kernels::AttentionEngine::kAuto);
  for (int32_t len = first; len < first + 40; ++len)
    ASSERT_TRUE(be_->PrepareAttention(1, len, hq, hq, dim, true, DType::kBF16).ok());
  const int32_t last = first + 39;
  Rng again = rng;  // the same inputs for both engines
  const auto automatic = run(kernels::AttentionEngine::kAuto, last);
  rng = again;
  EXPECT_EQ(automatic, run(kernels::AttentionEngine::kFlash, last)) << "shape " << last << " got a plan past the bound";
  be_->set_attention_engine(kernels::AttentionEngine::kCudnn);
  EXPECT_TRUE(be_->PrepareAttention(1, last, hq, hq, dim, true, DType::kBF16).ok());
  rng = again;
  const auto forced = run(kernels::AttentionEngine::kCudnn, last);
  EXPECT_NE(forced, automatic) << "cuDNN and flash agree bit for bit: the check above tells nothing";
  be_->set_attention_engine(kernels::AttentionEngine::kAuto);
}

// PrepareAttention builds ahead what the forward will use (cuDNN's plan) and computes
// nothing: sizes are checked on every backend; forced cuDNN refuses, by name, a dtype it
// cannot serve, as its forward does; a prepared shape then runs and matches the
// reference (the plan it built is the one the forward looks up).
TEST_P(OpTest, PrepareAttentionChecksAndReadiesTheForward) {
  EXPECT_THAT(std::string(be_->PrepareAttention(0, 64, 4, 2, 64, true, DType::kBF16).message()), HasSubstr("batch 0"));
  EXPECT_THAT(std::string(be_->PrepareAttention(1, 64, 4, 3, 64, true, DType::kBF16).message()),
              HasSubstr("kv heads divide"));
  be_->set_attention_engine(kernels::AttentionEngine::kCudnn);
  const auto f32 = be_->PrepareAttention(2, 64, 4, 2, 64, true, DType::kF32);
  if (cpu()) EXPECT_TRUE(f32.ok()) << f32;
  else EXPECT_THAT(std::string(f32.message()), HasSubstr("cuDNN engine serves bf16"));
  const int64_t B = 2, S = 96, hq = 4, hkv = 2, dim = 64, T = B * S;
  ASSERT_TRUE(be_->PrepareAttention(B, S, hq, hkv, dim, true, DType::kBF16).ok());
  Rng rng(seed_);
  auto qv = Quantize(rng.Normal(T * hq * dim), DType::kBF16), kv = Quantize(rng.Normal(T * hkv * dim), DType::kBF16);
  auto q = Make(*be_, {T, hq, dim}, DType::kBF16, qv), k = Make(*be_, {T, hkv, dim}, DType::kBF16, kv);
  auto out = Out(*be_, {T, hq, dim}, DType::kBF16), lse = Out(*be_, {T, hq}, DType::kF32);
  const std::vector<int32_t> cu = {0, static_cast<int32_t>(S), static_cast<int32_t>(T)};
  ASSERT_TRUE(be_->AttentionForward(q, k, k, Ints(*ref_, cu), true, out, lse).ok());
  std::vector<double> ro, rl;
  AttentionRef(qv, kv, kv, cu, hq, hkv, dim, true, ro, rl);
  EXPECT_LT(RelErr(Read(*be_, out), ro), 2e-2);
}

TEST_P(OpTest, AttentionRejectsBadSeqlens) {
  auto q = *be_->Empty({5, 2, 8}, DType::kF32), k = *be_->Empty({5, 1, 8}, DType::kF32), v = *be_->Empty({5, 1, 8}, DType::kF32);
  auto out = *be_->Empty({5, 2, 8}, DType::kF32), lse = *be_->Empty({5, 2}, DType::kF32);
  auto bad_end = Ints(*be_, {0, 3, 6});
  EXPECT_THAT(std::string(be_->AttentionForward(q, k, v, bad_end, true, out, lse).message()),
              HasSubstr("must start at 0 and end at tokens=5, got 0 ... 6"));
  auto not_inc = Ints(*be_, {0, 3, 3, 5});
  EXPECT_THAT(std::string(be_->AttentionForward(q, k, v, not_inc, true, out, lse).message()),
              HasSubstr("strictly increasing; entry 2 is 3 after 3"));
  auto host = MakeCpuBackend();
  auto host_bad = Ints(*host, {0, 2, 2, 5});  // a host cu_seqlens is validated in place
  EXPECT_THAT(std::string(be_->AttentionForward(q, k, v, host_bad, true, out, lse).message()),
              HasSubstr("strictly increasing; entry 2 is 2 after 2"));
  auto k3 = *be_->Empty({5, 3, 8}, DType::kF32);
  auto ok_cu = Ints(*be_, {0, 5});
  EXPECT_THAT(std::string(be_->AttentionForward(q, k3, k3, ok_cu, true, out, lse).message()),
              HasSubstr("query heads (2) must be a multiple of kv heads (3)"));
}

Tensor I64(Backend& b, const std::vector<int64_t>& v) {
  auto t = b.Empty({static_cast<int64_t>(v.size())}, DType::kI64);
  EXPECT_TRUE(b.CopyFromHost(v.data(), *t).ok());
  return *t;
}
template <typename T>
std::vector<T> ReadRaw(Backend& b, const Tensor& t) {
  std::vector<T> v(t.numel());
  EXPECT_TRUE(b.CopyToHost(t, v.data()).ok());
  return v;
}

struct SampleCase {
  std::vector<float> temp, top_p;
  std::vector<int32_t> top_k;
  std::vector<int64_t> seed, offset;
};

// Runs Sample on `b` and returns (tokens, logprobs).
std::pair<std::vector<int32_t>, std::vector<float>> RunSample(Backend& b, const std::vector<float>& z, int64_t n, int64_t v,
                                                              DType t, const SampleCase& c) {
  auto logits = Make(b, {n, v}, t, z), temp = Make(b, {n}, DType::kF32, c.temp), top_p = Make(b, {n}, DType::kF32, c.top_p);
  auto top_k = Ints(b, c.top_k), seed = I64(b, c.seed), offset = I64(b, c.offset);
  auto tok = Out(b, {n}, DType::kI32), lp = Out(b, {n}, DType::kF32);
  auto st = b.Sample(logits, temp, top_k, top_p, seed, offset, tok, lp);
  EXPECT_TRUE(st.ok()) << st;
  return {ReadRaw<int32_t>(b, tok), Read(b, lp)};
}

TEST_P(OpTest, SamplingGreedyAndReproducible) {
  Rng rng(seed_);
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int64_t v : {1, 7, 1000, 32003}) {
      const int64_t n = 64;
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << " v=" << v << " seed=" << seed_);
      auto z = Quantize(rng.Normal(n * v, 2.f), t);
      SampleCase c;
      for (int64_t i = 0; i < n; ++i) {
        c.temp.push_back(i % 4 == 0 ? 0.f : 0.7f + 0.1f * (i % 5));
        c.top_k.push_back(i % 3 == 0 ? 0 : 1 + i % 50);
        c.top_p.push_back(i % 2 == 0 ? 1.f : 0.9f);
        c.seed.push_back(1000 + i);
        c.offset.push_back(i % 7);
      }
      auto [tok, lp] = RunSample(*be_, z, n, v, t, c);
      auto [rtok, rlp] = RunSample(*ref_, z, n, v, t, c);
      int same = 0;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_GE(tok[i], 0);
        ASSERT_LT(tok[i], v);
        if (c.temp[i] == 0) {  // greedy: the argmax, lowest id on ties
          int64_t arg = 0;
          for (int64_t j = 1; j < v; ++j) if (z[i * v + j] > z[i * v + arg]) arg = j;
          EXPECT_EQ(tok[i], arg) << "row " << i;
        }
        // logprob of the chosen token under softmax(z / T), in double.
        double T = c.temp[i] > 0 ? c.temp[i] : 1.0, m = -INFINITY, s = 0;
        for (int64_t j = 0; j < v; ++j) m = std::max(m, double(z[i * v + j]));
        for (int64_t j = 0; j < v; ++j) s += std::exp((z[i * v + j] - m) / T);
        double want = (z[i * v + tok[i]] - m) / T - std::log(s);
        EXPECT_NEAR(lp[i], want, 1e-4 * std::max(1.0, std::abs(want))) << "row " << i;
        same += tok[i] == rtok[i];
      }
      // The same (seed, offset) draws the same u on every backend; only draws within
      // rounding of a CDF boundary may differ between f32 (CUDA) and double (CPU).
      EXPECT_GE(same, cpu() ? n : n - 2);
      auto [again, lp2] = RunSample(*be_, z, n, v, t, c);
      EXPECT_EQ(again, tok);  // replay is exact
    }
  }
}

TEST_P(OpTest, SamplingFollowsTheTruncatedDistribution) {
  // One row drawn 4000 times (offsets 0..3999): frequencies match softmax(z/T) restricted
  // to top-k then top-p, renormalized (chi-square with a generous bound), and nothing
  // outside the kept set is ever drawn.
  const int64_t v = 12, draws = 4000;
  std::vector<float> row = {2.0f, 1.5f, 1.4f, 1.0f, 0.5f, 0.3f, 0.0f, -0.5f, -1.0f, -2.0f, -3.0f, 0.9f};
  std::vector<float> z;
  SampleCase c;
  for (int64_t d = 0; d < draws; ++d) {
    z.insert(z.end(), row.begin(), row.end());
    c.temp.push_back(0.8f);
    c.top_k.push_back(6);
    c.top_p.push_back(0.8f);
    c.seed.push_back(42);
    c.offset.push_back(d);
  }
  auto [tok, lp] = RunSample(*be_, z, draws, v, DType::kF32, c);
  std::vector<double> p(v);
  double s = 0;
  for (int64_t j = 0; j < v; ++j) s += p[j] = std::exp(row[j] / 0.8);
  for (auto& x : p) x /= s;
  std::vector<int64_t> order(v);
  for (int64_t j = 0; j < v; ++j) order[j] = j;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
  std::vector<bool> keep(v, false);
  double kept_total = 0;
  for (int j = 0; j < 6; ++j) kept_total += p[order[j]];
  double cum = 0, mass = 0;
  for (int j = 0; j < 6; ++j) {
    keep[order[j]] = true;
    cum += p[order[j]];
    mass += p[order[j]];
    if (cum >= 0.8 * kept_total) break;
  }
  std::vector<int64_t> count(v, 0);
  for (int32_t t : tok) count[t]++;
  double chi2 = 0;
  int dof = -1;
  for (int64_t j = 0; j < v; ++j) {
    if (!keep[j]) {
      EXPECT_EQ(count[j], 0) << "token " << j << " is outside the kept set";
      continue;
    }
    double e = draws * p[j] / mass;
    chi2 += (count[j] - e) * (count[j] - e) / e;
    dof++;
  }
  EXPECT_LT(chi2, 30.0) << "chi-square " << chi2 << " with " << dof << " degrees of freedom";  // p < 1e-5 for dof <= 5
}

// The cache write of the rollout engine: each token's key and value row lands in its slot
// (a scattered, shuffled set of slots, host or device slots), nothing else changes (the
// cache is poisoned first), and bad slots are refused by name.
TEST_P(OpTest, KvCacheWriteScattersRows) {
  Rng rng(seed_);
  for (DType t : {DType::kF32, DType::kBF16}) {
    const int64_t blocks = 7, bs = 16, hkv = 2, dim = 64, tokens = 37;
    std::vector<int32_t> all(blocks * bs);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>(i);
    std::shuffle(all.begin(), all.end(), rng.gen);
    const std::vector<int32_t> slots(all.begin(), all.begin() + tokens);
    auto kv = Quantize(rng.Normal(tokens * hkv * dim), t), vv = Quantize(rng.Normal(tokens * hkv * dim), t);
    for (bool host : {true, false}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << (host ? " host slots" : " device slots") << " seed=" << seed_);
      auto k = Make(*be_, {tokens, hkv, dim}, t, kv), v = Make(*be_, {tokens, hkv, dim}, t, vv);
      auto kc = Out(*be_, {blocks, bs, hkv, dim}, t), vc = Out(*be_, {blocks, bs, hkv, dim}, t);
      auto st = be_->KvCacheWrite(k, v, Ints(host ? *ref_ : *be_, slots), kc, vc);
      ASSERT_TRUE(st.ok()) << st;
      auto gk = Read(*be_, kc), gv = Read(*be_, vc);
      std::vector<bool> written(blocks * bs, false);
      const int64_t row = hkv * dim;
      for (int64_t i = 0; i < tokens; ++i) {
        written[slots[i]] = true;
        for (int64_t j = 0; j < row; ++j) {
          ASSERT_EQ(gk[slots[i] * row + j], kv[i * row + j]) << "token " << i;
          ASSERT_EQ(gv[slots[i] * row + j], vv[i * row + j]) << "token " << i;
        }
      }
      for (int64_t s = 0; s < blocks * bs; ++s)
        if (!written[s]) {
          ASSERT_TRUE(std::isnan(gk[s * row]) && std::isnan(gv[s * row])) << "slot " << s << " was written";
        }
    }
  }
  auto k = *be_->Empty({2, 1, 8}, DType::kF32), kc = *be_->Empty({1, 4, 1, 8}, DType::kF32);
  EXPECT_THAT(std::string(be_->KvCacheWrite(k, k, Ints(*ref_, {1, 1}), kc, kc).message()), HasSubstr("slot 1 is written twice"));
  EXPECT_THAT(std::string(be_->KvCacheWrite(k, k, Ints(*ref_, {0, 4}), kc, kc).message()),
              HasSubstr("slot 4 is outside the cache (4 slots)"));
  auto wrong = *be_->Empty({1, 4, 2, 8}, DType::kF32);
  EXPECT_THAT(std::string(be_->KvCacheWrite(k, k, Ints(*ref_, {0, 1}), wrong, wrong).message()),
              HasSubstr("k_cache must be [blocks, block_size, 1, 8]"));
}

TEST_P(OpTest, PagedDecodeAttention) {
  Rng rng(seed_);
  // The second shape has a long context (CUDA: split across CTAs and merged), d = 128 and
  // a GQA group of 8; the first, short ones of every length class around a block.
  struct C { std::vector<int32_t> lens; int64_t hq, hkv, dim, blocks, maxb; };
  // Then GQA groups of 2 (Qwen3's shape) and 16 (the CUDA kernel's heads as rows, not
  // columns), and a batch of 136 short sequences at head dim 128 (on an H200 more than 4
  // waves of CTAs at two a multiprocessor: the two-stage instance).
  std::vector<int32_t> wide(136);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = static_cast<int32_t>(1 + (i * 37) % 100);
  for (DType t : {DType::kF32, DType::kBF16})
  // Few sequences split their context (the CUDA kernel: the splits of a kv head in one
  // cluster, some of them empty where a sequence is short); the last case's context has
  // more splits than a cluster holds (a second kernel merges them).
  for (const C& c : {C{{1, 16, 17, 100, 128}, 8, 2, 64, 40, 8}, C{{1000, 300, 1}, 16, 2, 128, 90, 64},
                     C{{3000, 40}, 8, 1, 64, 200, 192}, C{{1, 33, 190}, 16, 8, 128, 40, 16}, C{{70, 5}, 16, 1, 64, 10, 8},
                     C{wide, 16, 8, 128, 960, 7}}) {
    const int64_t B = static_cast<int64_t>(c.lens.size()), hq = c.hq, hkv = c.hkv, dim = c.dim, bs = 16,
                  blocks = c.blocks, maxb = c.maxb;
    const std::vector<int32_t>& lens = c.lens;
    SCOPED_TRACE(::testing::Message() << DTypeName(t) << " dim=" << dim << " seed=" << seed_);
    // Each sequence gets distinct blocks in a shuffled order (as an allocator would).
    std::vector<int32_t> perm(blocks);
    for (int i = 0; i < blocks; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng.gen);
    std::vector<int32_t> tables(B * maxb, -1);
    int next = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < (lens[b] + bs - 1) / bs; ++i) tables[b * maxb + i] = perm[next++];
    auto qv = Quantize(rng.Normal(B * hq * dim), t), kv = Quantize(rng.Normal(blocks * bs * hkv * dim), t),
         vv = Quantize(rng.Normal(blocks * bs * hkv * dim), t);
    auto q = Make(*be_, {B, hq, dim}, t, qv), kc = Make(*be_, {blocks, bs, hkv, dim}, t, kv),
         vc = Make(*be_, {blocks, bs, hkv, dim}, t, vv), bt = *be_->Empty({B, maxb}, DType::kI32), cl = Ints(*be_, lens);
    ASSERT_TRUE(be_->CopyFromHost(tables.data(), bt).ok());
    auto out = Out(*be_, {B, hq, dim}, t), lse = Out(*be_, {B, hq}, DType::kF32);
    auto st = be_->PagedAttention(q, kc, vc, bt, cl, out, lse);
    ASSERT_TRUE(st.ok()) << st;
    // Reference: gather each sequence's tokens, then plain softmax attention in double.
    std::vector<double> ro(B * hq * dim, 0.0), rl(B * hq);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < hq; ++h) {
        int64_t g = h / (hq / hkv);
        std::vector<double> sc(lens[b]);
        for (int64_t tok = 0; tok < lens[b]; ++tok) {
          int64_t base = ((int64_t(tables[b * maxb + tok / bs]) * bs + tok % bs) * hkv + g) * dim;
          double dot = 0;
          for (int64_t k = 0; k < dim; ++k) dot += double(qv[(b * hq + h) * dim + k]) * kv[base + k];
          sc[tok] = dot / std::sqrt(double(dim));
        }
        double m = *std::max_element(sc.begin(), sc.end()), z = 0;
        for (double x : sc) z += std::exp(x - m);
        rl[b * hq + h] = m + std::log(z);
        for (int64_t tok = 0; tok < lens[b]; ++tok) {
          int64_t base = ((int64_t(tables[b * maxb + tok / bs]) * bs + tok % bs) * hkv + g) * dim;
          for (int64_t k = 0; k < dim; ++k) ro[(b * hq + h) * dim + k] += std::exp(sc[tok] - m) / z * vv[base + k];
        }
      }
    // bf16 on CUDA: P is rounded to bf16 before the P V product (as in flash attention).
    EXPECT_LT(RelErr(Read(*be_, out), ro), t == DType::kBF16 ? 2e-2 : (cpu() ? 1e-6 : 1e-5));
    EXPECT_LT(RelErr(Read(*be_, lse), rl), cpu() ? 1e-6 : 1e-5);
    if (!cpu()) {  // host tables and lengths give the same result
      auto host = MakeCpuBackend();
      auto hbt = *host->Empty({B, maxb}, DType::kI32);
      std::copy(tables.begin(), tables.end(), hbt.data_as<int32_t>());
      auto first = Read(*be_, out);
      auto out2 = Out(*be_, {B, hq, dim}, t);
      ASSERT_TRUE(be_->PagedAttention(q, kc, vc, hbt, Ints(*host, lens), out2, lse).ok());
      EXPECT_EQ(RelErr(Read(*be_, out2), first), 0.0);
    }
    // A table entry outside the cache is refused, not read.
    std::vector<int32_t> bad = tables;
    bad[(B - 2) * maxb + 2] = static_cast<int32_t>(blocks + 7);
    ASSERT_TRUE(be_->CopyFromHost(bad.data(), bt).ok());
    EXPECT_THAT(std::string(be_->PagedAttention(q, kc, vc, bt, cl, out, lse).message()),
                HasSubstr(absl::StrCat("block_tables[", B - 2, "][2] = ", blocks + 7, " is not a block of the cache (",
                                       blocks, " blocks)")));
  }
}

}  // namespace
}  // namespace tessera::runtime::test
