// Device memory for the temporaries of a CUDA graph capture.
//
// While a capture runs, the CUDA backend's allocator takes its blocks from a CaptureArena
// instead of the stream-ordered pool. cudaMallocAsync and cudaFreeAsync under capture record
// allocation and free nodes into the graph, and a kernel whose predecessor is such a node
// cannot be a programmatic dependent (an edge of that type joins two kernel nodes only): every
// kernel of a captured decode step would wait for the kernel before it to drain completely.
// The arena's blocks are plain addresses inside chunks it holds, so the graph has no memory
// nodes. A block freed during a capture is reused by a later allocation of the same capture:
// the graph runs its kernels in capture order on one stream, and a programmatic dependent
// writes nothing before it waits for its predecessor (kernels/common/pdl.cuh).
//
// The graphs of one backend share its arena: they launch on the backend's one stream, never at
// once, so the arena holds the largest capture's peak, not the sum. A graph keeps the arena
// alive (shared_ptr): its chunks outlive every graph that uses their addresses. A chunk is
// `min_chunk` bytes, or the block it is made for rounded up to 2 MiB when that is larger; chunks
// are never returned before the arena goes, and a block never spans two. Thread-safe.
#pragma once
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::runtime {

class CaptureArena {
 public:
  using ChunkAlloc = std::function<absl::StatusOr<void*>(size_t bytes)>;
  using ChunkFree = std::function<void(void* p)>;
  static constexpr size_t kAlign = 256;

  CaptureArena(ChunkAlloc alloc, ChunkFree release, size_t min_chunk = size_t{32} << 20);
  ~CaptureArena();  // releases every chunk
  CaptureArena(const CaptureArena&) = delete;
  CaptureArena& operator=(const CaptureArena&) = delete;

  // A block of at least `bytes` (kAlign-aligned): the first free range that fits, else a new chunk.
  absl::StatusOr<void*> Allocate(size_t bytes);
  // Gives back a block of this arena (neighbouring free ranges merge); false (and nothing
  // changes) when `p` is not a block this arena handed out.
  bool Free(void* p);
  bool Owns(const void* p) const;

  size_t reserved_bytes() const;  // the chunks
  size_t in_use_bytes() const;    // the blocks handed out and not given back
  size_t chunks() const;

 private:
  struct Chunk {
    char* base;
    size_t size;
    std::map<size_t, size_t> free;  // offset -> length
    std::map<size_t, size_t> used;  // offset -> length
  };
  Chunk* Find(const void* p);

  ChunkAlloc alloc_;
  ChunkFree release_;
  size_t min_chunk_;
  mutable std::mutex mu_;
  std::vector<Chunk> chunks_;
  size_t reserved_ = 0, in_use_ = 0;
};

}  // namespace tessera::runtime
