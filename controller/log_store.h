// Executor logs, kept per job, attempt and executor under <state-dir>/logs so
// that they outlive the executors and the job.
//
// Threading: thread-safe.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/v1/job_service.pb.h"

namespace tessera::controller {

class LogStore {
 public:
  explicit LogStore(std::string dir) : dir_(std::move(dir)) {}
  void Append(const std::string& job_id, int attempt, int executor, const std::string& node_id,
              const std::vector<std::string>& lines);
  // Lines of (attempt, executor) from byte `offset` of that log; `offset` advances.
  struct Cursor {
    int attempt = 0;
    int executor = 0;
    std::string node_id;
    int64_t offset = 0;
  };
  // Every log file of the job (attempt 0 = all attempts; executor -1 = all).
  std::vector<Cursor> List(const std::string& job_id, int attempt, int executor);
  std::vector<v1::LogLine> ReadNew(const std::string& job_id, Cursor& c, size_t max_lines);
  // The last complete lines (at most max_lines, from the last 256 KiB) of one log.
  std::vector<v1::LogLine> Tail(const std::string& job_id, const Cursor& c, size_t max_lines);

 private:
  std::string PathOf(const std::string& job_id, int attempt, int executor) const;
  std::mutex mu_;
  std::string dir_;
};

}  // namespace tessera::controller
