#include "worker/comm/gloo_communicator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "common/util.h"
#include "tests/common/mem_store.h"

namespace tessera::comm {
namespace {

using ::testing::HasSubstr;

using ::tessera::testing::MemStore;

// Runs fn(rank, communicator) on `n` threads with fresh Gloo communicators.
template <typename F>
void OnRanks(int n, int64_t timeout_ms, F fn) {
  MemStore store;
  std::string key = RandomHex(4);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      auto c = MakeGlooCommunicator("test/tp/0", key, r, n, &store, {"127.0.0.1", timeout_ms});
      ASSERT_TRUE(c.ok()) << c.status();
      fn(r, **c);
    });
  for (auto& t : ts) t.join();
}

TEST(Gloo, CollectivesGiveExactResults) {
  const int n = 3;
  OnRanks(n, 20000, [&](int r, Communicator& c) {
    std::vector<float> in(7), out(7);
    for (int i = 0; i < 7; ++i) in[i] = r * 10 + i;
    ASSERT_TRUE(c.AllReduce(in.data(), out.data(), 7, DType::kF32, ReduceOp::kSum).ok());
    for (int i = 0; i < 7; ++i) EXPECT_EQ(out[i], 30 + 3 * i);
    ASSERT_TRUE(c.AllReduce(in.data(), out.data(), 7, DType::kF32, ReduceOp::kMax).ok());
    EXPECT_EQ(out[0], 20);
    std::vector<int32_t> g(3 * 2), mine = {r, r + 100};
    ASSERT_TRUE(c.AllGather(mine.data(), g.data(), 2, DType::kI32).ok());
    EXPECT_EQ(g, (std::vector<int32_t>{0, 100, 1, 101, 2, 102}));
    std::vector<float> rs_in(6), rs_out(2);
    for (int i = 0; i < 6; ++i) rs_in[i] = i + r;
    ASSERT_TRUE(c.ReduceScatter(rs_in.data(), rs_out.data(), 2, DType::kF32, ReduceOp::kSum).ok());
    EXPECT_EQ(rs_out[0], 3 * (2 * r) + 3);
    std::vector<float> b = {float(r), float(r)};
    ASSERT_TRUE(c.Broadcast(b.data(), 2, DType::kF32, 2).ok());
    EXPECT_EQ(b[0], 2);
    // Ring shift with send/recv in a group.
    float s = r, got = -1;
    c.GroupStart();
    ASSERT_TRUE(c.Send(&s, 1, DType::kF32, (r + 1) % n).ok());
    ASSERT_TRUE(c.Recv(&got, 1, DType::kF32, (r + n - 1) % n).ok());
    ASSERT_TRUE(c.GroupEnd().ok());
    EXPECT_EQ(got, (r + n - 1) % n);
    // bf16 sum of small integers is exact.
    uint16_t one = 0x3f80, sum = 0;  // 1.0
    ASSERT_TRUE(c.AllReduce(&one, &sum, 1, DType::kBF16, ReduceOp::kSum).ok());
    EXPECT_EQ(sum, 0x4040);  // 3.0
    // Host values (the trainer's token counts and ids), in place too.
    int64_t tokens = 10 + r;
    const CommStats before = c.stats();
    ASSERT_TRUE(c.AllReduceHost(&tokens, &tokens, 1, DType::kI64, ReduceOp::kSum).ok());
    EXPECT_GT(c.stats().host_op_seconds, before.host_op_seconds);  // host collectives are counted apart
    EXPECT_NEAR(c.stats().seconds - before.seconds, c.stats().host_op_seconds - before.host_op_seconds, 1e-9);
    EXPECT_EQ(tokens, 33);
    std::vector<int32_t> ids(3 * 2, -1);
    ASSERT_TRUE(c.AllGatherHost(mine.data(), ids.data(), 2, DType::kI32).ok());
    EXPECT_EQ(ids, (std::vector<int32_t>{0, 100, 1, 101, 2, 102}));
    EXPECT_GT(c.stats().calls, 5u);
  });
}

TEST(Gloo, HangingPeerTimesOutNamingGroupCollectiveAndSequence) {
  OnRanks(2, 1500, [&](int r, Communicator& c) {
    float x = 1, y = 0;
    ASSERT_TRUE(c.AllReduce(&x, &y, 1, DType::kF32, ReduceOp::kSum).ok());
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(6000));  // never joins the second call
      return;
    }
    auto t0 = std::chrono::steady_clock::now();
    auto st = c.AllReduce(&x, &y, 1, DType::kF32, ReduceOp::kSum);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("communicator 'test/tp/0' (gloo, rank 0 of 2): all_reduce #2"));
    EXPECT_LT(s, 5.0);  // the 1.5 s timeout, with room for a loaded machine
  });
}

TEST(Communicator, ChokePointValidates) {
  auto c = MakeSelfCommunicator("self");
  float x = 1;
  EXPECT_EQ(c->Broadcast(&x, 1, DType::kF32, 3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c->Send(&x, 1, DType::kF32, 0).message()), HasSubstr("peer 0 is not another rank of 1"));
  EXPECT_EQ(c->AllReduce(nullptr, &x, 1, DType::kF32, ReduceOp::kSum).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->GroupEnd().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tessera::comm
