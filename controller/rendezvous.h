// The rendezvous key-value store executors bootstrap communicators through, one
// namespace per (job, attempt). Get waits for a key; Barrier waits for `world`
// arrivals. Dropping a scope wakes its waiters with an error, so a torn-down
// attempt never leaves a thread blocked.
//
// Threading: all methods are thread-safe; waits block the calling thread only.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/base/thread_annotations.h"

namespace tessera::controller {

class Rendezvous {
 public:
  using ScopeKey = std::pair<std::string, int>;  // job id, attempt

  void Set(const ScopeKey& s, const std::string& key, const std::string& value);
  absl::StatusOr<std::string> Get(const ScopeKey& s, const std::string& key, int64_t timeout_ms);
  int64_t Add(const ScopeKey& s, const std::string& key, int64_t delta);
  absl::Status Barrier(const ScopeKey& s, const std::string& key, int world, int64_t timeout_ms);
  // Forgets the scope and fails its waiters with ABORTED.
  void Drop(const ScopeKey& s);
  size_t ScopeCount();

 private:
  struct Scope {
    std::map<std::string, std::string> kv;
    std::map<std::string, int64_t> counters;
    bool dropped = false;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<ScopeKey, Scope> scopes_ ABSL_GUARDED_BY(mu_);
  std::map<ScopeKey, int> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::controller
