#include "worker/runtime/capture_arena.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera::runtime {
namespace {
size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }
}  // namespace

CaptureArena::CaptureArena(ChunkAlloc alloc, ChunkFree release, size_t min_chunk)
    : alloc_(std::move(alloc)), release_(std::move(release)), min_chunk_(RoundUp(std::max<size_t>(min_chunk, kAlign), kAlign)) {}

CaptureArena::~CaptureArena() {
  for (Chunk& c : chunks_) release_(c.base);
}

absl::StatusOr<void*> CaptureArena::Allocate(size_t bytes) {
  const size_t len = RoundUp(std::max<size_t>(bytes, 1), kAlign);
  std::lock_guard<std::mutex> lock(mu_);
  for (Chunk& c : chunks_) {
    for (auto it = c.free.begin(); it != c.free.end(); ++it) {
      if (it->second < len) continue;
      const size_t off = it->first, left = it->second - len;
      c.free.erase(it);
      if (left > 0) c.free.emplace(off + len, left);
      c.used.emplace(off, len);
      in_use_ += len;
      return static_cast<void*>(c.base + off);
    }
  }
  const size_t size = len <= min_chunk_ ? min_chunk_ : RoundUp(len, size_t{2} << 20);
  absl::StatusOr<void*> base = alloc_(size);
  if (!base.ok()) return base.status();
  if (*base == nullptr) return absl::InternalError(absl::StrCat("capture arena: a chunk of ", size, " bytes came back null"));
  Chunk c{static_cast<char*>(*base), size, {}, {}};
  if (size > len) c.free.emplace(len, size - len);
  c.used.emplace(0, len);
  chunks_.push_back(std::move(c));
  reserved_ += size, in_use_ += len;
  return *base;
}

CaptureArena::Chunk* CaptureArena::Find(const void* p) {
  const char* q = static_cast<const char*>(p);
  for (Chunk& c : chunks_)
    if (q >= c.base && q < c.base + c.size) return &c;
  return nullptr;
}

bool CaptureArena::Owns(const void* p) const {
  std::lock_guard<std::mutex> lock(mu_);
  return const_cast<CaptureArena*>(this)->Find(p) != nullptr;
}

bool CaptureArena::Free(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  Chunk* c = Find(p);
  if (c == nullptr) return false;
  const size_t off = static_cast<size_t>(static_cast<char*>(p) - c->base);
  auto u = c->used.find(off);
  if (u == c->used.end()) return false;
  size_t start = off, len = u->second;
  c->used.erase(u);
  in_use_ -= len;
  auto next = c->free.lower_bound(off);
  if (next != c->free.end() && next->first == off + len) {
    len += next->second;
    next = c->free.erase(next);
  }
  if (next != c->free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first, len += prev->second;
      c->free.erase(prev);
    }
  }
  c->free.emplace(start, len);
  return true;
}

size_t CaptureArena::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}
size_t CaptureArena::in_use_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}
size_t CaptureArena::chunks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return chunks_.size();
}

}  // namespace tessera::runtime
