// HostOffload on the CPU backend: each storage moves once (views and aliases follow it),
// its memory goes back to the allocator while parked, and the bytes come back intact.
#include "worker/runtime/offload.h"

#include <cstring>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace tessera::runtime {
namespace {

TEST(HostOffload, ParksEachStorageOnceAndRestoresItsBytes) {
  auto be = MakeCpuBackend();
  auto a = Tensor::Empty({64, 16}, DType::kF32, be->allocator());
  auto b = Tensor::Empty({100}, DType::kBF16, be->allocator());
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> av(64 * 16);
  std::iota(av.begin(), av.end(), 0.5f);
  ASSERT_TRUE(be->CopyFromHost(av.data(), *a).ok());
  ASSERT_TRUE(be->Fill(*b, 0x3c).ok());
  auto rows = a->Slice(0, 8, 4);  // a view into a's storage, at an offset
  ASSERT_TRUE(rows.ok());
  const int64_t before = be->allocator()->stats().current_bytes;

  HostOffload parked(be.get());
  // a twice and its view: one storage; an undefined tensor is skipped.
  ASSERT_TRUE(parked.Offload({*a, *rows, *a, *b, Tensor()}).ok());
  EXPECT_TRUE(parked.offloaded());
  EXPECT_EQ(parked.bytes(), 64 * 16 * 4 + 256);  // each storage 256-byte aligned on the host: 200 -> 256
  EXPECT_EQ(be->allocator()->stats().current_bytes, before - (64 * 16 * 4 + 200));
  EXPECT_TRUE(a->storage()->detached() && b->storage()->detached());
  EXPECT_EQ(a->data(), nullptr);
  ASSERT_TRUE(parked.Offload({*a}).ok());  // already parked: nothing moves twice
  EXPECT_EQ(be->allocator()->stats().current_bytes, before - (64 * 16 * 4 + 200));

  ASSERT_TRUE(parked.Restore().ok());
  EXPECT_FALSE(parked.offloaded());
  EXPECT_EQ(be->allocator()->stats().current_bytes, before);
  std::vector<float> back(64 * 16);
  ASSERT_TRUE(be->CopyToHost(*a, back.data()).ok());
  EXPECT_EQ(back, av);
  std::vector<float> row(4 * 16);
  ASSERT_TRUE(be->CopyToHost(*rows, row.data()).ok());  // the view follows its storage
  EXPECT_EQ(row[0], av[8 * 16]);
  std::vector<uint8_t> bb(200);
  ASSERT_TRUE(be->CopyToHost(*b, bb.data()).ok());
  EXPECT_EQ(bb, std::vector<uint8_t>(200, 0x3c));
  ASSERT_TRUE(parked.Restore().ok());  // nothing parked: a no-op

  // Parked again (states that grew get a bigger host buffer) and restored.
  auto c = Tensor::Empty({4096}, DType::kF32, be->allocator());
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(be->Fill(*c, 0x11).ok());
  ASSERT_TRUE(parked.Offload({*a, *b, *c}).ok());
  EXPECT_GE(parked.host_bytes(), 64 * 16 * 4 + 256 + 4096 * 4);
  ASSERT_TRUE(parked.Restore().ok());
  std::vector<uint8_t> cb(4096 * 4);
  ASSERT_TRUE(be->CopyToHost(*c, cb.data()).ok());
  EXPECT_EQ(cb, std::vector<uint8_t>(4096 * 4, 0x11));
  ASSERT_TRUE(be->CopyToHost(*a, back.data()).ok());
  EXPECT_EQ(back, av);
}

}  // namespace
}  // namespace tessera::runtime
