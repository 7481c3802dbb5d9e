// Durable controller state in SQLite (WAL mode) under --state-dir: jobs (the
// whole Job proto, written before every transition is acted on) and node
// incarnations (for fencing across controller restarts).
//
// Threading: all methods are safe to call from any thread (one connection,
// serialized by a mutex).
#pragma once

#include <sqlite3.h>

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/base/thread_annotations.h"
#include "tessera/v1/common.pb.h"

namespace tessera::controller {

class Store {
 public:
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path);
  ~Store();

  absl::Status PutJob(const v1::Job& job);
  absl::StatusOr<std::vector<v1::Job>> LoadJobs();
  absl::Status PutNodeIncarnation(const std::string& node_id, int64_t incarnation);
  absl::StatusOr<std::map<std::string, int64_t>> LoadNodeIncarnations();

 private:
  explicit Store(sqlite3* db) : db_(db) {}
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::controller
