#include "controller/rendezvous.h"

#include <gtest/gtest.h>

#include <thread>

namespace tessera::controller {
namespace {

TEST(Rendezvous, GetWaitsForSetAndScopesAreSeparate) {
  Rendezvous r;
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    r.Set({"j", 1}, "k", "v");
  });
  auto v = r.Get({"j", 1}, "k", 5000);
  t.join();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, "v");
  EXPECT_EQ(r.Get({"j", 2}, "k", 10).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(r.Add({"j", 1}, "c", 2), 2);
  EXPECT_EQ(r.Add({"j", 1}, "c", 3), 5);
}

TEST(Rendezvous, BarrierAndDropWakeWaiters) {
  Rendezvous r;
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int i = 0; i < 3; ++i) ts.emplace_back([&] { ok += r.Barrier({"j", 1}, "b", 3, 5000).ok(); });
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok, 3);
  EXPECT_EQ(r.Barrier({"j", 1}, "b2", 2, 20).code(), absl::StatusCode::kDeadlineExceeded);
  std::thread w([&] { EXPECT_EQ(r.Get({"j", 1}, "never", 10000).status().code(), absl::StatusCode::kAborted); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  r.Drop({"j", 1});
  w.join();
}

}  // namespace
}  // namespace tessera::controller
