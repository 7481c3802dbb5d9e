#include "controller/store.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/util.h"

namespace tessera::controller {
namespace {
struct Stmt {
  sqlite3_stmt* s = nullptr;
  ~Stmt() { sqlite3_finalize(s); }
};
}  // namespace

namespace {
absl::StatusOr<sqlite3*> OpenDb(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::InternalError(absl::StrCat("cannot open state database ", path, ": ", msg));
  }
  return db;
}
}  // namespace

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(sqlite3* db, OpenDb(path));
  auto events = OpenDb(path);
  if (!events.ok()) {
    sqlite3_close(db);
    return events.status();
  }
  std::unique_ptr<Store> s(new Store(db, *events));
  std::lock_guard<std::mutex> l(s->mu_);
  for (const char* sql : {"PRAGMA journal_mode=WAL;", "PRAGMA synchronous=FULL;", "PRAGMA busy_timeout=5000;",
                          "CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, submission_id TEXT,"
                          " state INTEGER, created_ms INTEGER, proto BLOB NOT NULL);",
                          "CREATE UNIQUE INDEX IF NOT EXISTS jobs_submission ON jobs(submission_id)"
                          " WHERE submission_id != '';",
                          "CREATE TABLE IF NOT EXISTS nodes (node_id TEXT PRIMARY KEY, incarnation INTEGER);",
                          "CREATE TABLE IF NOT EXISTS events (job_id TEXT NOT NULL, seq INTEGER NOT NULL,"
                          " proto BLOB NOT NULL, PRIMARY KEY (job_id, seq)) WITHOUT ROWID;",
                          "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"}) {
    TESSERA_RETURN_IF_ERROR(Exec(s->db_, sql));
  }
  {
    std::lock_guard<std::mutex> e(s->events_mu_);
    TESSERA_RETURN_IF_ERROR(Exec(s->events_, "PRAGMA synchronous=NORMAL;"));
    TESSERA_RETURN_IF_ERROR(Exec(s->events_, "PRAGMA busy_timeout=5000;"));
  }
  // The database's id: made once (a store from before it had none gets one now).
  const std::string fresh = RandomHex(8);
  Stmt put;
  sqlite3_prepare_v2(s->db_, "INSERT OR IGNORE INTO meta(key, value) VALUES('id', ?);", -1, &put.s, nullptr);
  sqlite3_bind_text(put.s, 1, fresh.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(put.s) != SQLITE_DONE) return absl::InternalError(absl::StrCat("state database: ", sqlite3_errmsg(s->db_)));
  Stmt get;
  sqlite3_prepare_v2(s->db_, "SELECT value FROM meta WHERE key = 'id';", -1, &get.s, nullptr);
  if (sqlite3_step(get.s) != SQLITE_ROW) return absl::InternalError(absl::StrCat("state database: no id: ", sqlite3_errmsg(s->db_)));
  s->id_ = reinterpret_cast<const char*>(sqlite3_column_text(get.s, 0));
  return s;
}

Store::~Store() {
  std::lock_guard<std::mutex> l(mu_);
  std::lock_guard<std::mutex> e(events_mu_);
  sqlite3_close(events_);
  sqlite3_close(db_);
}

absl::Status Store::Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
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

absl::Status Store::PutEvent(const std::string& job_id, const v1::JobEvent& ev) {
  const std::string blob = ev.SerializeAsString();
  std::lock_guard<std::mutex> l(events_mu_);
  Stmt st;
  sqlite3_prepare_v2(events_, "INSERT INTO events(job_id, seq, proto) VALUES(?,?,?);", -1, &st.s, nullptr);
  sqlite3_bind_text(st.s, 1, job_id.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st.s, 2, ev.seq());
  sqlite3_bind_blob(st.s, 3, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(st.s) != SQLITE_DONE)
    return absl::InternalError(absl::StrCat("state database: cannot write event ", ev.seq(), " of job ", job_id, ": ",
                                            sqlite3_errmsg(events_)));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::JobEvent>> Store::LoadEvents(const std::string& job_id, int64_t after_seq, int64_t limit) {
  std::lock_guard<std::mutex> l(events_mu_);
  Stmt st;
  sqlite3_prepare_v2(events_, "SELECT seq, proto FROM events WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?;", -1, &st.s,
                     nullptr);
  sqlite3_bind_text(st.s, 1, job_id.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st.s, 2, after_seq);
  sqlite3_bind_int64(st.s, 3, limit);
  std::vector<v1::JobEvent> out;
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) {
    v1::JobEvent e;
    if (!e.ParseFromArray(sqlite3_column_blob(st.s, 1), sqlite3_column_bytes(st.s, 1)))
      return absl::DataLossError(absl::StrCat("state database: event ", sqlite3_column_int64(st.s, 0), " of job ", job_id,
                                              " is corrupt"));
    out.push_back(std::move(e));
  }
  if (rc != SQLITE_DONE) return absl::InternalError(absl::StrCat("state database: ", sqlite3_errmsg(events_)));
  return out;
}

absl::StatusOr<int64_t> Store::LastEventSeq(const std::string& job_id) {
  std::lock_guard<std::mutex> l(events_mu_);
  Stmt st;
  sqlite3_prepare_v2(events_, "SELECT MAX(seq) FROM events WHERE job_id = ?;", -1, &st.s, nullptr);
  sqlite3_bind_text(st.s, 1, job_id.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st.s) != SQLITE_ROW) return absl::InternalError(absl::StrCat("state database: ", sqlite3_errmsg(events_)));
  return sqlite3_column_type(st.s, 0) == SQLITE_NULL ? 0 : sqlite3_column_int64(st.s, 0);
}

}  // namespace tessera::controller
