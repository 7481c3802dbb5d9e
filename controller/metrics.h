// Controller metrics (Prometheus, prometheus-cpp), named as Prometheus asks: base units in
// the names (seconds, bytes), one unit per family, counters ending in _total, and no label
// called `job` — Prometheus gives every scraped series its own `job` (the scrape job), so
// a job's series carry `job_id`. A running job's per-step metrics are one family each
// (tessera_job_loss, tessera_job_generate_seconds, tessera_job_memory_peak_bytes, ...);
// its series go when the job ends. prometheus-cpp metrics are thread-safe; the per-job
// bookkeeping has its own lock.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>

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
  // One RPC's handling time: `full_method` as gRPC names it (/package.Service/Method),
  // `code` the status it ended with (OK, NOT_FOUND, ...).
  void ObserveRpc(const std::string& full_method, const std::string& code, double seconds);
  void IncSubmitted() { submitted_->Increment(); }
  // The latest value of a running job's per-step metric `key` as its progress reports
  // name it (step, loss, grad_norm, lr, tokens_per_s, mfu, memory_peak_gb, generate_s,
  // ...), in the family JobMetricName(key) gives, in that family's base unit.
  void SetJobMetric(const std::string& job_id, const std::string& key, double v);
  // Drops every per-job series of the job (it ended: its last values stay in Prometheus'
  // history, not in the exposition).
  void ForgetJob(const std::string& job_id);

  // The family and the factor into its base unit for a progress key: the key sanitized
  // to [a-z0-9_] under tessera_job_, with units spelled out — _s and _ms in seconds
  // (_seconds), _gb, _mb, _gib and _mib in bytes (_bytes), _per_s as _per_second, tflops as flops,
  // mfu as mfu_ratio; a name that would end in a suffix Prometheus reserves (_total,
  // _count, _sum, _bucket) gets _value.
  static std::pair<std::string, double> JobMetricName(const std::string& key);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>* jobs_;
  prometheus::Counter* restarts_;
  prometheus::Family<prometheus::Counter>* exits_;
  prometheus::Family<prometheus::Gauge>* nodes_;
  prometheus::Family<prometheus::Gauge>* lease_age_;
  prometheus::Family<prometheus::Histogram>* rpc_;
  prometheus::Counter* submitted_;
  std::mutex mu_;  // the per-job families and series below
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> job_families_;
  std::map<std::string, std::set<std::pair<prometheus::Family<prometheus::Gauge>*, prometheus::Gauge*>>> job_series_;
};

}  // namespace tessera::controller
