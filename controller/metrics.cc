#include "controller/metrics.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"

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
  rpc_ = &prometheus::BuildHistogram()
              .Name("tessera_rpc_duration_seconds")
              .Help("Controller RPC handling time by service, method and status code")
              .Register(*registry_);
  submitted_ = &prometheus::BuildCounter().Name("tessera_jobs_submitted_total").Help("Jobs submitted")
                    .Register(*registry_).Add({});
}

void Metrics::SetJobsByState(const std::string& state, double n) { jobs_->Add({{"state", state}}).Set(n); }

void Metrics::ObserveRpc(const std::string& full_method, const std::string& code, double seconds) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                                   0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  // "/tessera.v1.JobService/SubmitJob" -> service tessera.v1.JobService, method SubmitJob.
  std::string service, method = full_method;
  if (const size_t slash = full_method.rfind('/'); slash != std::string::npos && slash > 0) {
    service = full_method.substr(full_method[0] == '/' ? 1 : 0, slash - (full_method[0] == '/' ? 1 : 0));
    method = full_method.substr(slash + 1);
  }
  rpc_->Add({{"service", service}, {"method", method}, {"code", code}}, kBuckets).Observe(seconds);
}

std::pair<std::string, double> Metrics::JobMetricName(const std::string& key) {
  std::string s;
  for (char ch : key) {
    const char c = static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
    s += (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ? c : '_';
  }
  if (s.empty()) s = "unnamed";
  double scale = 1;
  if (absl::StrContains(s, "tflops")) s = absl::StrReplaceAll(s, {{"tflops", "flops"}}), scale *= 1e12;
  auto ends = [&](const char* suffix) { return absl::EndsWith(s, suffix) || s == std::string(suffix).substr(1); };
  struct Unit {
    const char* from;
    const char* to;
    double scale;
  };
  static constexpr Unit kUnits[] = {{"_per_s", "_per_second", 1},  {"_ms", "_seconds", 1e-3}, {"_s", "_seconds", 1},
                                    {"_gb", "_bytes", 1e9},        {"_mb", "_bytes", 1e6},    {"_gib", "_bytes", double(1 << 30)},
                                    {"_mib", "_bytes", double(1 << 20)}};
  for (const Unit& u : kUnits)
    if (absl::EndsWith(s, u.from)) {
      s = s.substr(0, s.size() - strlen(u.from)) + u.to, scale *= u.scale;
      break;
    }
  if (s == "mfu") s = "mfu_ratio";
  for (const char* reserved : {"_total", "_count", "_sum", "_bucket"})
    if (ends(reserved)) s += "_value";
  return {"tessera_job_" + s, scale};
}

void Metrics::SetJobMetric(const std::string& job_id, const std::string& key, double v) {
  const auto [name, scale] = JobMetricName(key);
  std::lock_guard<std::mutex> l(mu_);
  auto& family = job_families_[name];
  if (family == nullptr) {
    try {
      family = &prometheus::BuildGauge()
                    .Name(name)
                    .Help("Latest per-step value of a running job's " + key + " (from its progress reports)")
                    .Register(*registry_);
    } catch (const std::exception&) {  // a name the registry refuses: the value is not exported
      job_families_.erase(name);
      return;
    }
  }
  prometheus::Gauge& g = family->Add({{"job_id", job_id}});
  g.Set(v * scale);
  job_series_[job_id].insert({family, &g});
}

void Metrics::ForgetJob(const std::string& job_id) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = job_series_.find(job_id);
  if (it == job_series_.end()) return;
  for (auto& [family, gauge] : it->second) family->Remove(gauge);
  job_series_.erase(it);
}

}  // namespace tessera::controller
