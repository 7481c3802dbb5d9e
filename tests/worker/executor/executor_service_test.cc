// The executor's gRPC service as the driver reaches it (the controller's client over a
// loopback channel): credentials checked, and a sample batch larger than any message may
// be (32 MiB against the 16 MiB limit) streams through RlUpdate in chunks and trains
// exactly as the same samples handed over in process.
#include <grpcpp/grpcpp.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_util.h"
#include "controller/controller.h"
#include "worker/executor/executor.h"
#include "tests/worker/executor/executor_test_util.h"

namespace tessera::executor {
namespace {

using ::testing::HasSubstr;

using test::For;
v1::ExecutorConfig GrpoConfig() { return test::OneRankConfig("grpo"); }

// `rows` with every row widened to `width` columns of padding (the lengths unchanged).
v1::NamedTensor Widen(const v1::NamedTensor& t, int64_t width) {
  v1::NamedTensor w = t;
  const int64_t n = t.shape(0), old = t.shape(1);
  w.set_shape(1, width);
  std::string data(static_cast<size_t>(n * width * 4), '\0');
  for (int64_t i = 0; i < n; ++i) std::memcpy(&data[i * width * 4], t.data().data() + i * old * 4, old * 4);
  w.set_data(std::move(data));
  return w;
}

class Served {
 public:
  explicit Served(Executor* ex) : svc_(MakeExecutorService(ex)) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.SetMaxReceiveMessageSize(kControlMaxMessageBytes);
    b.SetMaxSendMessageSize(kControlMaxMessageBytes);
    b.RegisterService(svc_.get());
    server_ = b.BuildAndStart();
  }
  ~Served() { server_->Shutdown(); }
  std::shared_ptr<controller::ExecutorClient> Connect(const std::string& secret, int executor = 0) {
    auto c = controller::GrpcExecutorConnector("", /*insecure=*/true, 5000)(
        {absl::StrCat("127.0.0.1:", port_), secret, executor, "n0"});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }

 private:
  std::unique_ptr<v1::ExecutorService::Service> svc_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST(ExecutorService, CallsWithoutTheAttemptsSecretOrForAnotherExecutorAreRefused) {
  Executor ex(GrpoConfig(), nullptr, "127.0.0.1");
  Served served(&ex);
  auto stranger = served.Connect("wrong")->InitGroup(For<v1::InitGroupRequest>("actor"), 5000);
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kUnauthenticated);
  auto misrouted = served.Connect("attempt-secret", 3)->InitGroup(For<v1::InitGroupRequest>("actor"), 5000);
  EXPECT_EQ(misrouted.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(misrouted.status().message()), HasSubstr("the call was meant for executor '3'"));
  EXPECT_TRUE(served.Connect("attempt-secret")->InitGroup(For<v1::InitGroupRequest>("actor"), 5000).ok());
}

TEST(ExecutorService, ABatchLargerThanAnyMessageStreamsAndTrainsAsInProcess) {
  // Two executors started alike: one updated in process with the compact samples, the
  // other over gRPC with the same samples in rows 2^21 tokens wide (32 MiB of prompts).
  Executor near(GrpoConfig(), nullptr, "127.0.0.1"), far(GrpoConfig(), nullptr, "127.0.0.1");
  Served served(&far);
  auto client = served.Connect("attempt-secret");
  ASSERT_TRUE(near.InitGroup(For<v1::InitGroupRequest>("actor")).ok());
  ASSERT_TRUE(near.TrainInit(For<v1::TrainInitRequest>("actor")).ok());
  ASSERT_TRUE(client->InitGroup(For<v1::InitGroupRequest>("actor"), 10000).ok());
  ASSERT_TRUE(client->TrainInit(For<v1::TrainInitRequest>("actor"), 10000).ok());
  // The samples come back over the stream as the executor made them.
  v1::TensorBatch streamed, local;
  auto remote_stats = client->RolloutGenerate(For<v1::RolloutGenerateRequest>("actor"), &streamed, 10000);
  ASSERT_TRUE(remote_stats.ok()) << remote_stats.status();
  ASSERT_TRUE(near.RolloutGenerate(For<v1::RolloutGenerateRequest>("actor"), &local).ok());
  ASSERT_EQ(streamed.SerializeAsString(), local.SerializeAsString());
  EXPECT_EQ(remote_stats->samples(), 4);
  v1::TensorBatch wide = local;
  for (auto& t : *wide.mutable_tensors())
    if (t.name() == "prompt") t = Widen(t, int64_t{1} << 21);
  ASSERT_GT(wide.ByteSizeLong(), size_t{2} * kControlMaxMessageBytes);
  auto header = For<v1::RlUpdateHeader>("actor");
  auto want = near.RlUpdate(header, local);
  ASSERT_TRUE(want.ok()) << want.status();
  auto got = client->RlUpdate(header, wide, 60000);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_GT(want->grad_norm(), 0);
  EXPECT_EQ(got->grad_norm(), want->grad_norm());
  EXPECT_EQ(got->loss(), want->loss());
  EXPECT_EQ(got->samples(), want->samples());
  // A stream that breaks off mid-batch trains on nothing: the executor refuses the
  // partial batch, and the session's next update is the one it would have been.
  auto digest_before = client->WeightsDigest(For<v1::WeightsDigestRequest>("actor"), 10000);
  ASSERT_TRUE(digest_before.ok());
  v1::TensorBatch broken = wide;
  broken.mutable_tensors(0)->mutable_data()->resize(broken.tensors(0).data().size() - 4);
  auto refused = client->RlUpdate(header, broken, 60000);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("RlUpdate samples: tensor '"));
  auto digest_after = client->WeightsDigest(For<v1::WeightsDigestRequest>("actor"), 10000);
  ASSERT_TRUE(digest_after.ok());
  EXPECT_EQ(digest_after->digest(), digest_before->digest());
}

}  // namespace
}  // namespace tessera::executor
