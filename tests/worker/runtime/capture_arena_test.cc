#include "worker/runtime/capture_arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <set>
#include <vector>

#include "absl/status/status.h"

namespace tessera::runtime {
namespace {

// Chunks from the host heap, with a record of what was taken and given back.
struct Heap {
  std::vector<size_t> taken;
  std::set<void*> live;
  bool fail = false;
  CaptureArena::ChunkAlloc Alloc() {
    return [this](size_t n) -> absl::StatusOr<void*> {
      if (fail) return absl::ResourceExhaustedError("no memory");
      void* p = std::aligned_alloc(CaptureArena::kAlign, n);
      taken.push_back(n), live.insert(p);
      return p;
    };
  }
  CaptureArena::ChunkFree Release() {
    return [this](void* p) { live.erase(p), std::free(p); };
  }
};

TEST(CaptureArenaTest, ReusesFreedBlocksAndMergesNeighbours) {
  Heap heap;
  CaptureArena a(heap.Alloc(), heap.Release(), 4096);
  auto x = a.Allocate(1000), y = a.Allocate(1000), z = a.Allocate(1000);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok());
  EXPECT_EQ(heap.taken.size(), 1u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*x) % CaptureArena::kAlign, 0u);
  EXPECT_EQ(static_cast<char*>(*y) - static_cast<char*>(*x), 1024);
  EXPECT_EQ(a.in_use_bytes(), 3072u);
  // x and y free and adjacent: one range of 2048 serves a block of 2000 at x.
  EXPECT_TRUE(a.Free(*y));
  EXPECT_TRUE(a.Free(*x));
  auto w = a.Allocate(2000);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, *x);
  EXPECT_EQ(heap.taken.size(), 1u);
  // Everything back: the whole chunk is one range again.
  EXPECT_TRUE(a.Free(*w));
  EXPECT_TRUE(a.Free(*z));
  EXPECT_EQ(a.in_use_bytes(), 0u);
  auto all = a.Allocate(4096);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, *x);
  EXPECT_EQ(a.chunks(), 1u);
}

TEST(CaptureArenaTest, GrowsByAChunkWhenNothingFitsAndKeepsTheOldOne) {
  Heap heap;
  CaptureArena a(heap.Alloc(), heap.Release(), 4096);
  auto x = a.Allocate(3000);
  ASSERT_TRUE(x.ok());
  auto big = a.Allocate(5u << 20);  // past the chunk size: a chunk rounded to 2 MiB
  ASSERT_TRUE(big.ok());
  ASSERT_EQ(heap.taken.size(), 2u);
  EXPECT_EQ(heap.taken[1], 6u << 20);
  EXPECT_EQ(a.reserved_bytes(), 4096u + (6u << 20));
  // The first chunk's tail still serves a small block.
  auto small = a.Allocate(512);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(static_cast<char*>(*small) - static_cast<char*>(*x), 3072);
  EXPECT_TRUE(a.Owns(*big) && a.Owns(static_cast<char*>(*big) + 100));
}

TEST(CaptureArenaTest, RefusesForeignAndDoubleFrees) {
  Heap heap;
  CaptureArena a(heap.Alloc(), heap.Release(), 4096);
  auto x = a.Allocate(100);
  ASSERT_TRUE(x.ok());
  int local = 0;
  EXPECT_FALSE(a.Owns(&local));
  EXPECT_FALSE(a.Free(&local));
  EXPECT_FALSE(a.Free(static_cast<char*>(*x) + 256));  // inside the chunk, not a block start
  EXPECT_TRUE(a.Free(*x));
  EXPECT_FALSE(a.Free(*x));
  EXPECT_EQ(a.in_use_bytes(), 0u);
}

TEST(CaptureArenaTest, AChunkThatCannotBeHadIsAnErrorAndChangesNothing) {
  Heap heap;
  CaptureArena a(heap.Alloc(), heap.Release(), 4096);
  heap.fail = true;
  auto x = a.Allocate(100);
  EXPECT_EQ(x.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.chunks(), 0u);
  EXPECT_EQ(a.in_use_bytes(), 0u);
  heap.fail = false;
  EXPECT_TRUE(a.Allocate(100).ok());
}

TEST(CaptureArenaTest, GivesItsChunksBackWhenItGoes) {
  Heap heap;
  {
    CaptureArena a(heap.Alloc(), heap.Release(), 4096);
    ASSERT_TRUE(a.Allocate(10000).ok());
    ASSERT_TRUE(a.Allocate(3u << 20).ok());
    EXPECT_EQ(heap.live.size(), 2u);
  }
  EXPECT_TRUE(heap.live.empty());
}

}  // namespace
}  // namespace tessera::runtime
