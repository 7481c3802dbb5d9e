// controller/metrics.h: progress keys become Prometheus families in base units, a job's
// series carry job_id (never `job`), and a finished job's series leave the exposition.
#include "controller/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

namespace tessera::controller {
namespace {
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;

std::string Exposition(Metrics& m) { return prometheus::TextSerializer().Serialize(m.registry()->Collect()); }

TEST(Metrics, ProgressKeysBecomeFamiliesInBaseUnits) {
  EXPECT_THAT(Metrics::JobMetricName("loss"), Pair("tessera_job_loss", 1.0));
  EXPECT_THAT(Metrics::JobMetricName("generate_s"), Pair("tessera_job_generate_seconds", 1.0));
  EXPECT_THAT(Metrics::JobMetricName("dp_wait_ms"), Pair("tessera_job_dp_wait_seconds", 1e-3));
  EXPECT_THAT(Metrics::JobMetricName("memory_peak_gb"), Pair("tessera_job_memory_peak_bytes", 1e9));
  EXPECT_THAT(Metrics::JobMetricName("kv_cache_gib"), Pair("tessera_job_kv_cache_bytes", double(1 << 30)));
  EXPECT_THAT(Metrics::JobMetricName("tokens_per_s"), Pair("tessera_job_tokens_per_second", 1.0));
  EXPECT_THAT(Metrics::JobMetricName("model_tflops_per_s"), Pair("tessera_job_model_flops_per_second", 1e12));
  EXPECT_THAT(Metrics::JobMetricName("mfu"), Pair("tessera_job_mfu_ratio", 1.0));
  EXPECT_THAT(Metrics::JobMetricName("Reward-Mean"), Pair("tessera_job_reward_mean", 1.0));
  // Suffixes Prometheus reads as a counter's or a histogram's are not a gauge's.
  EXPECT_EQ(Metrics::JobMetricName("tokens_total").first, "tessera_job_tokens_total_value");
  EXPECT_EQ(Metrics::JobMetricName("sample_count").first, "tessera_job_sample_count_value");
}

TEST(Metrics, AJobsSeriesCarryJobIdAndLeaveWithTheJob) {
  Metrics m;
  m.SetJobMetric("job-a", "loss", 2.5);
  m.SetJobMetric("job-a", "memory_peak_gb", 1.5);
  m.SetJobMetric("job-b", "loss", 3.0);
  std::string text = Exposition(m);
  EXPECT_THAT(text, HasSubstr("tessera_job_loss{job_id=\"job-a\"} 2.5"));
  EXPECT_THAT(text, HasSubstr("tessera_job_memory_peak_bytes{job_id=\"job-a\"} 1500000000"));
  EXPECT_THAT(text, HasSubstr("tessera_job_loss{job_id=\"job-b\"} 3"));
  EXPECT_THAT(text, Not(HasSubstr("{job=")));
  m.ForgetJob("job-a");
  text = Exposition(m);
  EXPECT_THAT(text, Not(HasSubstr("job-a")));
  EXPECT_THAT(text, HasSubstr("tessera_job_loss{job_id=\"job-b\"} 3"));
  m.ForgetJob("job-a");  // twice, or a job that never reported: nothing to do
  m.ForgetJob("never-ran");
  m.SetJobMetric("job-a", "loss", 1.0);  // a later report of the id starts its series again
  EXPECT_THAT(Exposition(m), HasSubstr("tessera_job_loss{job_id=\"job-a\"} 1"));
}

TEST(Metrics, RpcTimesAreLabelledByServiceMethodAndCode) {
  Metrics m;
  m.ObserveRpc("/tessera.v1.JobService/SubmitJob", "OK", 0.002);
  m.ObserveRpc("/tessera.v1.JobService/GetJob", "NOT_FOUND", 0.001);
  const std::string text = Exposition(m);
  EXPECT_THAT(text, HasSubstr("tessera_rpc_duration_seconds_count{code=\"OK\",method=\"SubmitJob\",service=\"tessera.v1.JobService\"} 1"));
  EXPECT_THAT(text, HasSubstr("tessera_rpc_duration_seconds_count{code=\"NOT_FOUND\",method=\"GetJob\",service=\"tessera.v1.JobService\"} 1"));
}

}  // namespace
}  // namespace tessera::controller
