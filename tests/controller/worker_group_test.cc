#include "controller/driver/worker_group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>

namespace tessera::controller {
namespace {

// Records the samples RlUpdate got and answers with their first float; TrainStep answers
// with its step (or fails).
class EchoExecutor : public ExecutorClient {
 public:
  absl::StatusOr<v1::InitGroupResponse> InitGroup(const v1::InitGroupRequest&, int64_t) override { return v1::InitGroupResponse{}; }
  absl::StatusOr<v1::TrainStepResponse> TrainStep(const v1::TrainStepRequest& req, int64_t) override {
    group = req.group();
    if (fail) return absl::UnavailableError("executor died");
    v1::TrainStepResponse r;
    r.set_step(req.step());
    return r;
  }
  absl::StatusOr<v1::RlUpdateResponse> RlUpdate(const v1::RlUpdateHeader& req, const v1::TensorBatch& samples, int64_t) override {
    group = req.group();
    got = samples;
    v1::RlUpdateResponse r;
    r.set_step(req.step());
    return r;
  }
  absl::Status Shutdown(int64_t) override { return absl::OkStatus(); }
  void Cancel() override { cancelled = true; }
  v1::TensorBatch got;
  std::string group;
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

TEST(WorkerGroup, DpSplitShardsByDpRank) {
  // tp=2 dp=2 pp=2: 8 ranks; the DP rank of r is (r/2)%2.
  auto [ex, clients] = Fleet<EchoExecutor>(8);
  WorkerGroup g("actor", parallel::Layout{2, 1, 2, 2}, clients, 1000);
  v1::RlUpdateHeader h;
  h.set_step(7);
  auto out = g.RlUpdateDpSplit(h, Rows(4));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 8u);
  EXPECT_EQ((*out)[5].step(), 7);
  // Ranks 0,1,4,5 (dp 0) got rows 0-1; ranks 2,3,6,7 (dp 1) got rows 2-3.
  for (int r : {0, 1, 4, 5}) EXPECT_EQ(At(ex[r]->got.tensors(0), 0), 0) << r;
  for (int r : {2, 3, 6, 7}) EXPECT_EQ(At(ex[r]->got.tensors(0), 0), 4) << r;
  EXPECT_EQ(ex[3]->got.tensors(0).shape(0), 2);
  EXPECT_EQ(ex[3]->group, "actor");
  auto bad = g.RlUpdateDpSplit(h, Rows(3));
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("tensor 'x' has 3 rows, not divisible by dp=2"));
}

TEST(WorkerGroup, OneToAllReportsTheFailedRankAndCancelsPeers) {
  auto [ex, clients] = Fleet<EchoExecutor>(4);
  WorkerGroup g("actor", parallel::Layout{1, 1, 4, 1}, clients, 1000);
  v1::TrainStepRequest req;
  req.set_step(3);
  auto ok = g.OneToAll(&ExecutorClient::TrainStep, req);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)[3].step(), 3);
  EXPECT_EQ(ex[2]->group, "actor");  // the fan-out names the group
  ex[2]->fail = true;
  auto st = g.OneToAll(&ExecutorClient::TrainStep, req);
  EXPECT_THAT(std::string(st.status().message()), ::testing::HasSubstr("group 'actor' rank 2: TrainStep: executor died"));
  EXPECT_TRUE(ex[0]->cancelled);
  // An operation the client does not implement says which.
  auto none = g.OneToAll(&ExecutorClient::Generate, v1::GenerateRequest{});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(none.status().message()), ::testing::HasSubstr("Generate is not implemented"));
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
