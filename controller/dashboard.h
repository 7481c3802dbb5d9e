// The controller's web dashboard (docs/design.md §9): one page — nodes and their devices, jobs
// with their states and reasons, the selected job's curves (every per-step metric its
// driver reports: loss, reward, tokens/s, phase times...) and its logs per rank —
// refreshed every 2 s from a small JSON API on the same port:
//   GET /                              the page (controller/dashboard_page.cc)
//   GET /api/cluster                   GetClusterStatus, as JSON
//   GET /api/jobs                      the last 200 jobs (summaries)
//   GET /api/jobs/<id>                 one job whole (its spec, reason and result)
//   GET /api/jobs/<id>/events?from=N   the job's events after seq N (states, progress), a
//                                      page of at most JobManager::kEventsPerPage; "more"
//                                      when the page is full (ask again from its last seq)
//   GET /api/jobs/<id>/logs?rank=R     the last 200 lines of rank R's latest attempt
// The API takes the same bearer tokens as the gRPC API (any role: it only reads) and
// answers 401 without one; the page asks for a token and keeps it in the tab's
// sessionStorage (or takes it once from the URL fragment, #token=..., which browsers do
// not send to the server). The server is plaintext HTTP and therefore loopback-only
// (as every plaintext listener, docs/design.md §9): reach it remotely through an SSH tunnel or
// `kubectl port-forward` (docs/operations.md).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/rpc/auth.h"
#include "controller/job_manager.h"
#include "controller/log_store.h"

namespace tessera::controller {

class Dashboard {
 public:
  // Listens on `listen` (a loopback host:port; port 0 picks one); INVALID_ARGUMENT for a
  // non-loopback address.
  static absl::StatusOr<std::unique_ptr<Dashboard>> Start(const std::string& listen, JobManager* jobs,
                                                          const TokenAuthority* tokens, LogStore* logs);
  ~Dashboard();
  int port() const;

 private:
  struct Impl;
  explicit Dashboard(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The page's HTML (with its script and styles inline: nothing is fetched from elsewhere).
extern const char kDashboardPage[];

}  // namespace tessera::controller
