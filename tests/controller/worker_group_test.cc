#include "controller/driver/worker_group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>

namespace tessera::controller {
namespace {

// Echoes its input batch with every float multiplied by 10, and records what it got.
class EchoExecutor : public ExecutorClient {
 public:
  absl::StatusOr<v1::InitGroupResponse> InitGroup(const v1::InitGroupRequest&, int64_t) override { return v1::InitGroupResponse{}; }
  absl::StatusOr<v1::CallResponse> Call(const v1::CallRequest& req, int64_t) override {
    got = req.batch();
    if (fail) return absl::UnavailableError("executor died");
    v1::CallResponse r;
    *r.mutable_batch() = req.batch();
    for (auto& t : *r.mutable_batch()->mutable_tensors()) {
      std::string& d = *t.mutable_data();
      for (size_t i = 0; i + 4 <= d.size(); i += 4) {
        float f;
        std::memcpy(&f, &d[i], 4);
        f *= 10;
        std::memcpy(&d[i], &f, 4);
      }
    }
    r.set_result_json(req.method());
    return r;
  }
  absl::Status Shutdown(int64_t) override { return absl::OkStatus(); }
  void Cancel() override { cancelled = true; }
  v1::TensorBatch got;
  bool fail = false;
  std::atomic<bool> cancelled{false};
};

// n fake executors, and the same as the driver's clients.
template <class T>
std::pair<std::vector<std::shared_ptr<T>>, std::vector<std::shared_ptr<ExecutorClient>>> Fleet(int n) {
  std::vector<std::shared_ptr<T>> ex;
  std::vector<std::shared_ptr<ExecutorClient>> clients;
  for (int i = 0; i < n; ++i) {
    ex.push_back(std::make_shared<T>());
    clients.push_back(ex.back());
  }
  return {ex, clients};
}

v1::TensorBatch Rows(int rows) {
  v1::TensorBatch b;
  auto* t = b.add_tensors();
  t->set_name("x");
  t->set_dtype(v1::DTYPE_F32);
  t->add_shape(rows);
  t->add_shape(2);
  for (int i = 0; i < rows * 2; ++i) {
    float f = i;
    t->mutable_data()->append(reinterpret_cast<char*>(&f), 4);
  }
  return b;
}

float At(const v1::NamedTensor& t, int i) {
  float f;
  std::memcpy(&f, t.data().data() + 4 * i, 4);
  return f;
}

TEST(WorkerGroup, DpSplitShardsByDpRankAndGathersFromOutputRanks) {
  // tp=2 dp=2 pp=2: 8 ranks; DP rank of r is (r/2)%2; output ranks are tp=0 on the last stage: 4 and 6.
  auto [ex, clients] = Fleet<EchoExecutor>(8);
  WorkerGroup g("actor", parallel::Layout{2, 1, 2, 2}, clients, 1000);
  auto out = g.CallDpSplit("fwd", "{}", Rows(4));
  ASSERT_TRUE(out.ok()) << out.status();
  // Ranks 0,1,4,5 (dp 0) got rows 0-1; ranks 2,3,6,7 (dp 1) got rows 2-3.
  for (int r : {0, 1, 4, 5}) EXPECT_EQ(At(ex[r]->got.tensors(0), 0), 0) << r;
  for (int r : {2, 3, 6, 7}) EXPECT_EQ(At(ex[r]->got.tensors(0), 0), 4) << r;
  EXPECT_EQ(ex[3]->got.tensors(0).shape(0), 2);
  ASSERT_EQ(out->tensors(0).shape(0), 4);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(At(out->tensors(0), i), 10 * i);
  auto bad = g.CallDpSplit("fwd", "{}", Rows(3));
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("tensor 'x' has 3 rows, not divisible by dp=2"));
}

TEST(WorkerGroup, OneToAllReportsTheFailedRankAndCancelsPeers) {
  auto [ex, clients] = Fleet<EchoExecutor>(4);
  WorkerGroup g("actor", parallel::Layout{1, 1, 4, 1}, clients, 1000);
  auto ok = g.CallOneToAll("ping", "{}");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)[3].result_json(), "ping");
  ex[2]->fail = true;
  auto st = g.CallOneToAll("ping", "{}");
  EXPECT_THAT(std::string(st.status().message()), ::testing::HasSubstr("group 'actor' rank 2: ping: executor died"));
  EXPECT_TRUE(ex[0]->cancelled);
}

// InitGroup as a rank of a Gloo rendezvous sees it: one rank fails at once (its call was
// refused); the others wait for its keys until they give up or are cancelled.
class RendezvousExecutor : public ExecutorClient {
 public:
  absl::StatusOr<v1::InitGroupResponse> InitGroup(const v1::InitGroupRequest&, int64_t) override {
    if (refuse) return absl::FailedPreconditionError("this is executor 1; the call was meant for executor '2'");
    std::unique_lock<std::mutex> l(mu);
    if (!cv.wait_for(l, std::chrono::seconds(5), [&] { return cancelled; }))
      return absl::UnavailableError("rendezvous key 'gloo/workers/tp/1/rank_0' was not set within 5000 ms");
    return absl::CancelledError("cancelled");
  }
  absl::StatusOr<v1::CallResponse> Call(const v1::CallRequest&, int64_t) override { return v1::CallResponse{}; }
  absl::Status Shutdown(int64_t) override { return absl::OkStatus(); }
  void Cancel() override {
    std::lock_guard<std::mutex> l(mu);
    cancelled = true;
    cv.notify_all();
  }
  bool refuse = false;
  std::mutex mu;
  std::condition_variable cv;
  bool cancelled = false;
};

TEST(WorkerGroup, InitAllReportsTheRankThatFailedFirstAndDoesNotWaitForThePeers) {
  auto [ex, clients] = Fleet<RendezvousExecutor>(4);
  ex[2]->refuse = true;
  WorkerGroup g("workers", parallel::Layout{2, 1, 2, 1}, clients, 1000);
  auto t0 = std::chrono::steady_clock::now();
  auto st = g.InitAll();
  ASSERT_FALSE(st.ok());
  // Rank 2's own failure, not rank 0's wait for it; the peers were cancelled, not left to
  // time out.
  EXPECT_THAT(std::string(st.status().message()),
              ::testing::HasSubstr("group 'workers' rank 2: InitGroup (first of 4 ranks to fail): this is executor 1"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
}

}  // namespace
}  // namespace tessera::controller
