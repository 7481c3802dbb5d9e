// Controller metrics (Prometheus, prometheus-cpp). Families are created once;
// prometheus-cpp metrics are thread-safe.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

namespace tessera::controller {

class Metrics {
 public:
  Metrics();
  std::shared_ptr<prometheus::Registry> registry() { return registry_; }

  void SetJobsByState(const std::string& state, double n);
  void IncRestarts() { restarts_->Increment(); }
  void IncExecutorExit(const std::string& how) { exits_->Add({{"how", how}}).Increment(); }
  void SetNodes(const std::string& state, double n) { nodes_->Add({{"state", state}}).Set(n); }
  void SetLeaseAge(const std::string& node, double seconds) { lease_age_->Add({{"node", node}}).Set(seconds); }
  void ObserveRpc(const std::string& method, double seconds);
  void IncSubmitted() { submitted_->Increment(); }
  // The latest value of a training job's per-step metric (loss, grad_norm, lr,
  // tokens_per_s, model_tflops_per_s, mfu, memory_peak_gb, ...) and its step.
  void SetJobStepMetric(const std::string& job, const std::string& metric, double v) {
    job_metric_->Add({{"job", job}, {"metric", metric}}).Set(v);
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>* jobs_;
  prometheus::Counter* restarts_;
  prometheus::Family<prometheus::Counter>* exits_;
  prometheus::Family<prometheus::Gauge>* nodes_;
  prometheus::Family<prometheus::Gauge>* lease_age_;
  prometheus::Family<prometheus::Histogram>* rpc_;
  prometheus::Counter* submitted_;
  prometheus::Family<prometheus::Gauge>* job_metric_;
};

}  // namespace tessera::controller
