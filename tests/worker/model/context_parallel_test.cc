// Context parallelism on the CPU backend (threads, Gloo): the load-balanced split, and
// ring attention forward and backward on 2 and 3 CP ranks against plain attention over
// the whole batch (the rows each rank holds, 1e-5).
#include "worker/model/context_parallel.h"

#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/mem_store.h"
#include "tests/worker/model/model_test_util.h"
#include "worker/comm/gloo_communicator.h"

namespace tessera::model {
namespace {
using runtime::Tensor;

TEST(ContextParallel, SplitKeepsChunksRAnd2cpMinus1MinusR) {
  TokenBatch g = test::RandomBatch(50, 1, {8, 3});  // the second sequence is padded to 4
  auto r0 = SplitForContextParallel(g, 2, 0), r1 = SplitForContextParallel(g, 2, 1);
  ASSERT_TRUE(r0.ok() && r1.ok());
  // Sequence 0 (8 tokens): chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  EXPECT_EQ(r0->cu_seqlens, (std::vector<int32_t>{0, 2, 3, 5, 6}));
  EXPECT_EQ(r0->positions, (std::vector<int32_t>{0, 1, 0, 6, 7, 3}));
  EXPECT_EQ(r1->positions, (std::vector<int32_t>{2, 3, 1, 4, 5, 2}));
  EXPECT_EQ(r0->tokens[0], g.tokens[0]);
  EXPECT_EQ(r0->targets[5], -1);  // padding takes no loss
  EXPECT_EQ(r0->tokens[5], 0);
  EXPECT_EQ(*ContextParallelHalf(*r0), (std::vector<int32_t>{0, 2, 3}));
  TokenBatch bad = *r0;
  bad.cu_seqlens = {0, 2, 3, 6};
  EXPECT_FALSE(ContextParallelHalf(bad).ok());
  EXPECT_FALSE(SplitForContextParallel(g, 2, 2).ok());
}

// Rows of the global batch that CP rank r holds, in its order.
std::vector<int64_t> RowsOf(const std::vector<int32_t>& cu, int cp, int r) {
  std::vector<int64_t> rows[2];
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t chunk = (cu[s + 1] - cu[s]) / (2 * cp);
    for (int h = 0; h < 2; ++h) {
      const int64_t c = h == 0 ? r : 2 * cp - 1 - r;
      for (int64_t j = 0; j < chunk; ++j) rows[h].push_back(cu[s] + c * chunk + j);
    }
  }
  rows[0].insert(rows[0].end(), rows[1].begin(), rows[1].end());
  return rows[0];
}

TEST(ContextParallel, RingAttentionEqualsAttentionOverTheWholeBatch) {
  const int64_t hq = 4, hkv = 2, d = 8;
  const std::vector<int32_t> cu = {0, 12, 24, 60};  // divisible by 2 cp for cp = 2, 3
  const int64_t t = cu.back();
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  auto rnd = [&](int64_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
  };
  const auto q = rnd(t * hq * d), k = rnd(t * hkv * d), v = rnd(t * hkv * d), dout = rnd(t * hq * d);
  auto be = runtime::MakeCpuBackend();
  auto make = [&](runtime::Backend& b, const std::vector<float>& x, std::vector<int64_t> shape) {
    auto out = *b.Empty(shape, DType::kF32);
    EXPECT_TRUE(b.CopyFromHost(x.data(), out).ok());
    return out;
  };
  auto read = [](runtime::Backend& b, const Tensor& x) {
    std::vector<float> h(x.numel());
    EXPECT_TRUE(b.CopyToHost(x, h.data()).ok());
    return h;
  };
  // The reference: plain causal attention over the whole batch.
  Tensor cut = *be->Empty({4}, DType::kI32);
  std::copy(cu.begin(), cu.end(), cut.data_as<int32_t>());
  Tensor rq = make(*be, q, {t, hq, d}), rk = make(*be, k, {t, hkv, d}), rv = make(*be, v, {t, hkv, d});
  Tensor ro = *be->Empty({t, hq, d}, DType::kF32), rl = *be->Empty({t, hq}, DType::kF32);
  ASSERT_TRUE(be->AttentionForward(rq, rk, rv, cut, true, ro, rl).ok());
  Tensor rdo = make(*be, dout, {t, hq, d});
  Tensor rdq = *be->Empty({t, hq, d}, DType::kF32), rdk = *be->Empty({t, hkv, d}, DType::kF32),
         rdv = *be->Empty({t, hkv, d}, DType::kF32);
  ASSERT_TRUE(be->AttentionBackward(rq, rk, rv, cut, true, ro, rdo, rl, rdq, rdk, rdv).ok());
  const auto ref_o = read(*be, ro), ref_l = read(*be, rl), ref_dq = read(*be, rdq), ref_dk = read(*be, rdk),
             ref_dv = read(*be, rdv);
  for (int cp : {1, 2, 3}) {
    testing::MemStore store;
    const std::string key = RandomHex(4);
    std::vector<std::thread> threads;
    for (int r = 0; r < cp; ++r)
      threads.emplace_back([&, r] {
        SCOPED_TRACE(::testing::Message() << "cp " << cp << " rank " << r);
        auto comm = comm::MakeGlooCommunicator("cp", key, r, cp, &store, {"127.0.0.1", 60000});
        ASSERT_TRUE(comm.ok()) << comm.status();
        auto b = runtime::MakeCpuBackend();
        const auto rows = RowsOf(cu, cp, r);
        const int64_t tl = rows.size();
        auto pick = [&](const std::vector<float>& x, int64_t width) {
          std::vector<float> out;
          for (int64_t row : rows) out.insert(out.end(), x.begin() + row * width, x.begin() + (row + 1) * width);
          return out;
        };
        Tensor lq = make(*b, pick(q, hq * d), {tl, hq, d}), lk = make(*b, pick(k, hkv * d), {tl, hkv, d}),
               lv = make(*b, pick(v, hkv * d), {tl, hkv, d}), ldo = make(*b, pick(dout, hq * d), {tl, hq, d});
        std::vector<int32_t> half = {0};
        for (size_t s = 0; s + 1 < cu.size(); ++s) half.push_back(half.back() + (cu[s + 1] - cu[s]) / (2 * cp));
        Tensor hc = *b->Empty({static_cast<int64_t>(half.size())}, DType::kI32);
        std::copy(half.begin(), half.end(), hc.data_as<int32_t>());
        Tensor lo = *b->Empty({tl, hq, d}, DType::kF32), ll = *b->Empty({tl, hq}, DType::kF32);
        ASSERT_TRUE(RingAttentionForward(*b, **comm, lq, lk, lv, hc, lo, ll).ok());
        EXPECT_LT(test::RelDiff(read(*b, lo), pick(ref_o, hq * d)), 1e-5);
        EXPECT_LT(test::RelDiff(read(*b, ll), pick(ref_l, hq)), 1e-5);
        Tensor dq = *b->Empty({tl, hq, d}, DType::kF32), dk = *b->Empty({tl, hkv, d}, DType::kF32),
               dv = *b->Empty({tl, hkv, d}, DType::kF32);
        ASSERT_TRUE(RingAttentionBackward(*b, **comm, lq, lk, lv, hc, lo, ldo, ll, dq, dk, dv).ok());
        EXPECT_LT(test::RelDiff(read(*b, dq), pick(ref_dq, hq * d)), 1e-5);
        EXPECT_LT(test::RelDiff(read(*b, dk), pick(ref_dk, hkv * d)), 1e-5);
        EXPECT_LT(test::RelDiff(read(*b, dv), pick(ref_dv, hkv * d)), 1e-5);
      });
    for (auto& th : threads) th.join();
  }
}

}  // namespace
}  // namespace tessera::model
