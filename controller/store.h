// Durable controller state in SQLite (WAL mode) under --state-dir: jobs (the
// whole Job proto, written before every transition is acted on), node
// incarnations (for fencing across controller restarts), and every job's events
// (state changes and per-step progress: WatchJob's stream and the dashboard's
// curves, kept whole however long the run).
//
// Jobs and nodes are committed with a sync to disk (synchronous=FULL). Events go
// through a second connection that commits without one (synchronous=NORMAL: each
// commit is in the write-ahead log when it returns, so a killed controller loses
// none; a power loss may lose the last ones): an event costs tens of microseconds,
// not a disk flush.
//
// Threading: all methods are safe to call from any thread (each connection
// serialized by a mutex of its own).
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
#include "tessera/v1/job_service.pb.h"

namespace tessera::controller {

class Store {
 public:
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path);
  ~Store();

  absl::Status PutJob(const v1::Job& job);
  absl::StatusOr<std::vector<v1::Job>> LoadJobs();
  absl::Status PutNodeIncarnation(const std::string& node_id, int64_t incarnation);
  absl::StatusOr<std::map<std::string, int64_t>> LoadNodeIncarnations();

  // This state database's id, made when it was created: the epoch of its event
  // numbering (WatchJobRequest.epoch), the same across controller restarts.
  const std::string& id() const { return id_; }
  // An event of a job (its seq set, above every earlier one of the job).
  absl::Status PutEvent(const std::string& job_id, const v1::JobEvent& ev);
  // The job's events with seq > after_seq, in order, at most `limit`.
  absl::StatusOr<std::vector<v1::JobEvent>> LoadEvents(const std::string& job_id, int64_t after_seq, int64_t limit);
  // The job's highest event seq (0: none).
  absl::StatusOr<int64_t> LastEventSeq(const std::string& job_id);

 private:
  Store(sqlite3* db, sqlite3* events) : db_(db), events_(events) {}
  static absl::Status Exec(sqlite3* db, const char* sql);
  std::mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  std::mutex events_mu_;
  sqlite3* events_ ABSL_GUARDED_BY(events_mu_);
  std::string id_;
};

}  // namespace tessera::controller
