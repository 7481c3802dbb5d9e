#include "controller/metrics.h"

namespace tessera::controller {

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  jobs_ = &prometheus::BuildGauge().Name("tessera_jobs").Help("Jobs by state").Register(*registry_);
  restarts_ = &prometheus::BuildCounter().Name("tessera_job_restarts_total").Help("Job attempt restarts")
                   .Register(*registry_).Add({});
  exits_ = &prometheus::BuildCounter().Name("tessera_executor_exits_total")
                .Help("Executor exits by how they ended (ok, error, signal, lost)").Register(*registry_);
  nodes_ = &prometheus::BuildGauge().Name("tessera_nodes").Help("Nodes by state").Register(*registry_);
  lease_age_ = &prometheus::BuildGauge().Name("tessera_node_lease_age_seconds")
                    .Help("Seconds since the node's last heartbeat").Register(*registry_);
  rpc_ = &prometheus::BuildHistogram().Name("tessera_rpc_seconds").Help("RPC latency by method").Register(*registry_);
  job_metric_ = &prometheus::BuildGauge()
                     .Name("tessera_job_step_metric")
                     .Help("Latest per-step metric of a running job (step, loss, grad_norm, lr, tokens_per_s, mfu, ...)")
                     .Register(*registry_);
  submitted_ = &prometheus::BuildCounter().Name("tessera_jobs_submitted_total").Help("Jobs submitted")
                    .Register(*registry_).Add({});
}

void Metrics::SetJobsByState(const std::string& state, double n) { jobs_->Add({{"state", state}}).Set(n); }

void Metrics::ObserveRpc(const std::string& method, double seconds) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                                   0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  rpc_->Add({{"method", method}}, kBuckets).Observe(seconds);
}

}  // namespace tessera::controller
