#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "common/rpc/auth.h"
#include "common/rpc/grpc_util.h"
#include "common/rpc/tls.h"
#include "common/util.h"

namespace tessera {
namespace {

TEST(Auth, RolesAreOrdered) {
  TokenAuthority a;
  a.AddToken("admin-token-0123456789", Role::kAdmin, "root");
  a.AddToken("read-token-0123456789", Role::kRead, "viewer");
  EXPECT_EQ(a.Check("", Role::kRead).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(a.Check("nope", Role::kRead).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(a.Check("read-token-0123456789", Role::kRead).ok());
  auto denied = a.Check("read-token-0123456789", Role::kSubmit);
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(denied.status().message()), ::testing::HasSubstr("token 'viewer' has role read; this call needs submit"));
  EXPECT_THAT(std::string(denied.status().message()), ::testing::Not(::testing::HasSubstr("read-token-0123456789")));
  EXPECT_EQ(a.Check("admin-token-0123456789", Role::kAdmin)->name, "root");
}

TEST(Auth, TokenFileIsValidated) {
  std::string p = "/tmp/tessera-tokens-" + RandomHex(4);
  ASSERT_TRUE(WriteFileAtomic(p, "# c\nsubmit ci 0123456789abcdef0123\n").ok());
  TokenAuthority a;
  EXPECT_TRUE(a.LoadFile(p).ok());
  EXPECT_TRUE(a.Check("0123456789abcdef0123", Role::kSubmit).ok());
  ASSERT_TRUE(WriteFileAtomic(p, "boss x 0123456789abcdef0123\n").ok());
  EXPECT_THAT(std::string(TokenAuthority().LoadFile(p).message()), ::testing::HasSubstr(":1: unknown role 'boss'"));
  ASSERT_TRUE(WriteFileAtomic(p, "read x short\n").ok());
  EXPECT_THAT(std::string(TokenAuthority().LoadFile(p).message()), ::testing::HasSubstr("shorter than 16"));
  unlink(p.c_str());
}

TEST(Tls, IssuesCertificatesSignedByTheCa) {
  auto ca = MakeCa("test-ca");
  ASSERT_TRUE(ca.ok()) << ca.status();
  EXPECT_THAT(ca->cert_pem, ::testing::HasSubstr("BEGIN CERTIFICATE"));
  auto leaf = IssueCert(*ca, "node", {"localhost", kExecutorTlsName}, {"127.0.0.1"}, 30);
  ASSERT_TRUE(leaf.ok()) << leaf.status();
  EXPECT_THAT(leaf->key_pem, ::testing::HasSubstr("PRIVATE KEY"));
  EXPECT_FALSE(IssueCert(KeyPair{"junk", "junk"}, "x", {}, {}, 1).ok());
}

// gRPC would set SO_REUSEPORT: a second server on a served port would bind too, and the
// kernel would split connections between the two processes.
TEST(Grpc, AServedPortCannotBeBoundTwice) {
  int port = 0;
  auto first = StartHealthServer("127.0.0.1:0", &port);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_GT(port, 0);
  int again = 0;
  auto second = StartHealthServer(absl::StrCat("127.0.0.1:", port), &again);
  ASSERT_FALSE(second.ok()) << "a second server bound port " << port;
  EXPECT_THAT(std::string(second.status().message()), ::testing::HasSubstr("is the port in use?"));
  (*first)->Shutdown();
}

// Calls between the cluster's daemons ride out a server that is not up yet (a controller
// restarting, a host too loaded to finish a handshake in time) within their deadline,
// instead of failing at the first refused connection; an answer that is an error is
// returned at once.
TEST(Grpc, ACallBetweenDaemonsWaitsForALateServerWithinItsDeadline) {
  int port = 0;
  auto probe = StartHealthServer("127.0.0.1:0", &port);  // a port that was free a moment ago
  ASSERT_TRUE(probe.ok()) << probe.status();
  (*probe)->Shutdown();
  probe->reset();
  const std::string addr = absl::StrCat("127.0.0.1:", port);
  auto ch = MakeChannel({addr, "", true});
  ASSERT_TRUE(ch.ok());
  auto stub = grpc::health::v1::Health::NewStub(*ch);
  std::unique_ptr<grpc::Server> late;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    int p = 0;
    auto s = StartHealthServer(addr, &p);
    if (s.ok()) late = std::move(*s);
  });
  const auto t0 = std::chrono::steady_clock::now();
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status st = CallWithRetry("", 20000, [&](grpc::ClientContext* ctx, int64_t) {
    grpc::health::v1::HealthCheckRequest req;
    return stub->Check(ctx, req, &resp);
  });
  starter.join();
  ASSERT_NE(late, nullptr) << "port " << port << " was taken meanwhile";
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1400));
  // A definite answer is not retried: NOT_FOUND for a service the server does not have.
  const auto t1 = std::chrono::steady_clock::now();
  st = CallWithRetry("", 20000, [&](grpc::ClientContext* ctx, int64_t) {
    grpc::health::v1::HealthCheckRequest req;
    req.set_service("no.such.Service");
    return stub->Check(ctx, req, &resp);
  });
  EXPECT_EQ(st.error_code(), grpc::NOT_FOUND);
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(2));
  late->Shutdown();
}

TEST(Util, ConstantTimeEqualsAndBytes) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_EQ(*ParseBytes("4KiB"), 4096);
  EXPECT_EQ(*ParseBytes("1GiB"), 1LL << 30);
  EXPECT_FALSE(ParseBytes("-1").ok());
  EXPECT_FALSE(ParseBytes("2TiB").ok());
  EXPECT_EQ(FormatBytes(1 << 20), "1MiB");
}

}  // namespace
}  // namespace tessera
