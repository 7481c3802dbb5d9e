#include "controller/store.h"

#include "absl/strings/str_cat.h"
#include "common/util.h"

namespace tessera::controller {
namespace {
struct Stmt {
  sqlite3_stmt* s = nullptr;
  ~Stmt() { sqlite3_finalize(s); }
};
}  // namespace

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::InternalError(absl::StrCat("cannot open state database ", path, ": ", msg));
  }
  std::unique_ptr<Store> s(new Store(db));
  std::lock_guard<std::mutex> l(s->mu_);
  for (const char* sql : {"PRAGMA journal_mode=WAL;", "PRAGMA synchronous=FULL;", "PRAGMA busy_timeout=5000;",
                          "CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, submission_id TEXT,"
                          " state INTEGER, created_ms INTEGER, proto BLOB NOT NULL);",
                          "CREATE UNIQUE INDEX IF NOT EXISTS jobs_submission ON jobs(submission_id)"
                          " WHERE submission_id != '';",
                          "CREATE TABLE IF NOT EXISTS nodes (node_id TEXT PRIMARY KEY, incarnation INTEGER);"}) {
    auto st = s->Exec(sql);
    if (!st.ok()) return st;
  }
  return s;
}

Store::~Store() {
  std::lock_guard<std::mutex> l(mu_);
  sqlite3_close(db_);
}

absl::Status Store::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err ? err : "?";
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat("state database: ", m));
  }
  return absl::OkStatus();
}

absl::Status Store::PutJob(const v1::Job& job) {
  std::string blob = job.SerializeAsString();
  std::lock_guard<std::mutex> l(mu_);
  Stmt st;
  sqlite3_prepare_v2(db_,
                     "INSERT INTO jobs(job_id, submission_id, state, created_ms, proto) VALUES(?,?,?,?,?)"
                     " ON CONFLICT(job_id) DO UPDATE SET state=excluded.state, proto=excluded.proto;",
                     -1, &st.s, nullptr);
  sqlite3_bind_text(st.s, 1, job.job_id().c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st.s, 2, job.submission_id().c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(st.s, 3, job.state());
  sqlite3_bind_int64(st.s, 4, job.created_ms());
  sqlite3_bind_blob(st.s, 5, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(st.s) != SQLITE_DONE)
    return absl::InternalError(absl::StrCat("state database: cannot write job ", job.job_id(), ": ", sqlite3_errmsg(db_)));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Job>> Store::LoadJobs() {
  std::lock_guard<std::mutex> l(mu_);
  Stmt st;
  sqlite3_prepare_v2(db_, "SELECT job_id, proto FROM jobs ORDER BY created_ms, job_id;", -1, &st.s, nullptr);
  std::vector<v1::Job> out;
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) {
    v1::Job j;
    const void* b = sqlite3_column_blob(st.s, 1);
    int n = sqlite3_column_bytes(st.s, 1);
    if (!j.ParseFromArray(b, n))
      return absl::DataLossError(absl::StrCat("state database: job ", reinterpret_cast<const char*>(sqlite3_column_text(st.s, 0)), " is corrupt"));
    out.push_back(std::move(j));
  }
  if (rc != SQLITE_DONE) return absl::InternalError(absl::StrCat("state database: ", sqlite3_errmsg(db_)));
  return out;
}

absl::Status Store::PutNodeIncarnation(const std::string& node_id, int64_t inc) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt st;
  sqlite3_prepare_v2(db_, "INSERT INTO nodes(node_id, incarnation) VALUES(?,?) ON CONFLICT(node_id) DO UPDATE SET incarnation=excluded.incarnation;", -1, &st.s, nullptr);
  sqlite3_bind_text(st.s, 1, node_id.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st.s, 2, inc);
  if (sqlite3_step(st.s) != SQLITE_DONE) return absl::InternalError(absl::StrCat("state database: ", sqlite3_errmsg(db_)));
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, int64_t>> Store::LoadNodeIncarnations() {
  std::lock_guard<std::mutex> l(mu_);
  Stmt st;
  sqlite3_prepare_v2(db_, "SELECT node_id, incarnation FROM nodes;", -1, &st.s, nullptr);
  std::map<std::string, int64_t> out;
  while (sqlite3_step(st.s) == SQLITE_ROW)
    out[reinterpret_cast<const char*>(sqlite3_column_text(st.s, 0))] = sqlite3_column_int64(st.s, 1);
  return out;
}

}  // namespace tessera::controller
