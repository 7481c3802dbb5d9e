// Integration tests: real controller, agents and executors on loopback.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iostream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc/grpc_util.h"
#include "common/util.h"
#include "tessera/v1/executor_service.grpc.pb.h"
#include "tessera/v1/job_service.grpc.pb.h"
#include "tessera/v1/node_service.grpc.pb.h"
#include "tessera/v1/rendezvous_service.grpc.pb.h"
#include <grpcpp/health_check_service_interface.h>
#include "grpc/health/v1/health.grpc.pb.h"
#include <regex>
#include <set>

#include "common/spec/job_spec.h"
#include "tests/integration/cluster.h"

namespace tessera::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;


TEST(Cluster, CommCheckTp2Dp2Pp2OnTwoAgentsOverGloo) {
  auto c = Up({.agents = 2, .cpu_slots = 4});
  std::string id = Submit(*c, CommCheckSpec(8, 2, 2, 0));
  std::ostringstream progress;
  auto job = c->client().Watch(id, progress);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason() << "\n" << progress.str();
  EXPECT_THAT(progress.str(), HasSubstr("RUNNING"));
  EXPECT_THAT(progress.str(), HasSubstr("tp: 10 checks passed"));
  // Both nodes were used, TP pairs on one node.
  std::set<std::string> nodes;
  for (const auto& a : job->assignments()) nodes.insert(a.node_id());
  EXPECT_EQ(nodes.size(), 2u);
  auto table = nlohmann::json::parse(job->result_json())["comm_check"];
  std::set<std::string> kinds;
  for (const auto& r : table) {
    kinds.insert(r["kind"].get<std::string>());
    EXPECT_EQ(r["errors"].get<int>(), 0);
    EXPECT_GT(r["busbw_gbps"].get<double>(), 0);
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"tp", "dp", "pp", "dp_cp", "mp", "embedding", "world"}));
  // Every rank's log is retrievable after the job ended.
  std::ostringstream logs;
  ASSERT_TRUE(c->client().Logs(id, -1, 0, false, logs).ok());
  for (int x = 0; x < 8; ++x)
    EXPECT_THAT(logs.str(), HasSubstr(absl::StrCat("[attempt 1 executor ", x, " n"))) << logs.str();
  EXPECT_THAT(logs.str(), HasSubstr("serving ExecutorService"));
  std::ostringstream one;
  ASSERT_TRUE(c->client().Logs(id, 5, 0, false, one).ok());
  EXPECT_THAT(one.str(), Not(HasSubstr("executor 4 ")));
  {  // A rank below -1 is refused by name (unset and -1 both mean every rank).
    ChannelOptions o;
    o.address = c->address();
    o.ca_pem = c->ca_pem();
    auto jobs = v1::JobService::NewStub(*MakeChannel(o));
    grpc::ClientContext ctx;
    PrepareContext(ctx, c->read_token(), 5000);
    v1::GetLogsRequest req;
    req.set_job_id(id);
    req.set_rank(-2);
    auto reader = jobs->GetLogs(&ctx, req);
    v1::GetLogsResponse r;
    while (reader->Read(&r)) {}
    auto st = reader->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(st.error_message(), HasSubstr("rank"));
  }
  // Metrics on the controller and the agent.
  std::string cm = HttpGet(c->controller_metrics_port(), "/metrics");
  EXPECT_THAT(cm, HasSubstr("tessera_jobs{state=\"SUCCEEDED\"} 1"));
  EXPECT_THAT(cm, HasSubstr("tessera_nodes{state=\"READY\"} 2"));
  // RPC handling time by service, method and status code (the GetLogs above was refused).
  EXPECT_THAT(cm, HasSubstr("tessera_rpc_duration_seconds_bucket{code=\"OK\",method=\"SubmitJob\",service=\"tessera.v1.JobService\""));
  EXPECT_THAT(cm, HasSubstr("tessera_rpc_duration_seconds_count{code=\"INVALID_ARGUMENT\",method=\"GetLogs\""));
  EXPECT_THAT(cm, HasSubstr("tessera_node_lease_age_seconds{node=\"n0\"}"));
  EXPECT_THAT(cm, HasSubstr("tessera_executor_exits_total"));
  std::string am = HttpGet(c->agent_metrics_port(), "/metrics");
  EXPECT_THAT(am, HasSubstr("tessera_agent_registered 1"));
  EXPECT_THAT(am, HasSubstr("tessera_agent_executor_exits_total{how="));
  EXPECT_THAT(am, HasSubstr("tessera_agent_heartbeat_rtt_seconds_count"));
  // gRPC health on the agent's and the controller's probe ports (plaintext) and on the
  // controller's own port (TLS).
  for (auto [addr, tls] : {std::pair{absl::StrCat("127.0.0.1:", c->agent_health_port()), false},
                           std::pair{absl::StrCat("127.0.0.1:", c->controller_health_port()), false},
                           std::pair{c->address(), true}}) {
    ChannelOptions o;
    o.address = addr;
    o.insecure = !tls;
    o.ca_pem = tls ? c->ca_pem() : "";
    auto ch = MakeChannel(o);
    auto stub = grpc::health::v1::Health::NewStub(*ch);
    grpc::ClientContext ctx;
    PrepareContext(ctx, "", 5000);
    grpc::health::v1::HealthCheckRequest hreq;
    grpc::health::v1::HealthCheckResponse hresp;
    auto hs = stub->Check(&ctx, hreq, &hresp);
    EXPECT_TRUE(hs.ok()) << addr << ": " << hs.error_message();
    EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING) << addr;
    if (addr == absl::StrCat("127.0.0.1:", c->agent_health_port())) continue;
    // The controller answers per service too, and NOT_FOUND for a name it does not serve.
    for (const char* name : {"tessera.v1.JobService", "tessera.v1.ClusterService", "tessera.v1.NodeService",
                             "tessera.v1.RendezvousService", "tessera.v1.NoSuchService"}) {
      grpc::ClientContext sctx;
      PrepareContext(sctx, "", 5000);
      hreq.set_service(name);
      auto ss = stub->Check(&sctx, hreq, &hresp);
      if (std::string(name) == "tessera.v1.NoSuchService") {
        EXPECT_EQ(ss.error_code(), grpc::StatusCode::NOT_FOUND) << addr;
      } else {
        EXPECT_TRUE(ss.ok()) << addr << " " << name << ": " << ss.error_message();
        EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING) << addr << " " << name;
      }
    }
  }
  // The devices are free again.
  auto st = c->client().Status();
  for (const auto& n : st->nodes())
    for (const auto& d : n.devices()) EXPECT_TRUE(d.used_by_job().empty());
}

// The training oracle through the whole system: real controller, agent and executor
// processes, Gloo over loopback. tp2 x dp2 with ZeRO-1 (4 executors) and tp2 with
// sequence parallelism (2 executors, padded micro-batches) report the same per-step
// losses as one executor on the same model and data.
TEST(Cluster, PretrainLayoutsEqualOneRank) {
  auto c = Up({.agents = 1, .cpu_slots = 4});
  v1::Job last;  // the job `run` watched last
  auto run = [&](const v1::JobSpec& spec) -> std::vector<double> {
    std::string id = Submit(*c, spec);
    std::ostringstream progress;
    auto job = c->client().Watch(id, progress);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return {};
    last = *job;
    EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason() << "\n" << progress.str();
    EXPECT_THAT(progress.str(), HasSubstr("step 3/3 loss"));
    EXPECT_THAT(progress.str(), HasSubstr("model_tflops_per_s="));
    EXPECT_THAT(progress.str(), HasSubstr("memory_peak_gb="));
    EXPECT_THAT(progress.str(), Not(HasSubstr("mfu=")));  // CPU slots: no device peak, no MFU
    if (spec.groups(0).layout().pp() > 1) {  // pp2, 2 micro-batches per DP rank: ideal 1/2
      EXPECT_THAT(progress.str(), HasSubstr("pipeline_bubble="));
      EXPECT_THAT(progress.str(), HasSubstr("pipeline_bubble_ideal=0.5"));
    } else {
      EXPECT_THAT(progress.str(), Not(HasSubstr("pipeline_bubble")));
    }
    // The exposed gradient reduction: for DP x CP > 1 with ZeRO-0/1 and no pipeline.
    const auto& l = spec.groups(0).layout();
    const bool overlapped = l.dp() * std::max(1, l.cp()) > 1 && l.pp() <= 1 && l.zero() <= 1;
    EXPECT_EQ(progress.str().find("dp_wait_ms=") != std::string::npos, overlapped) << progress.str();
    // A finished job's series are gone from the controller's /metrics (its values while it
    // ran: tests/integration/prometheus_test.cc).
    const std::string m = HttpGet(c->controller_metrics_port(), "/metrics");
    EXPECT_THAT(m, Not(HasSubstr(absl::StrCat("job_id=\"", id, "\""))));
    return nlohmann::json::parse(job->result_json())["losses"].get<std::vector<double>>();
  };
  const auto one = run(PretrainSpec(1, 1, 0, 3));
  const auto sharded = run(PretrainSpec(4, 2, 3, 3));
  const auto sp = run(PretrainSpec(2, 2, 0, 3, /*sp=*/true));
  const auto cp = run(PretrainSpec(4, 2, 0, 3, /*sp=*/true, /*cp=*/2));
  const auto pp = run(PretrainSpec(4, 1, 1, 3, /*sp=*/false, /*cp=*/1, /*pp=*/2));  // pp2 x dp2 ZeRO-1, 1F1B
  // `stage_layers: auto`, resolved by the controller at submit: here the LM head weighs
  // about a layer, so the balanced split of 2 layers is [2, 0] (the last stage runs only
  // the head) — and the job shows the split it ran.
  v1::JobSpec auto_spec = PretrainSpec(4, 1, 1, 3, /*sp=*/false, /*cp=*/1, /*pp=*/2);
  auto_spec.mutable_groups(0)->mutable_layout()->set_balance_stages(true);
  const auto balanced = run(auto_spec);
  const v1::ParallelLayout& ran = last.spec().groups(0).layout();
  EXPECT_THAT(std::vector<int>(ran.stage_layers().begin(), ran.stage_layers().end()), ElementsAre(2, 0));
  EXPECT_FALSE(ran.balance_stages());
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(sharded.size(), 3u);
  ASSERT_EQ(sp.size(), 3u);
  ASSERT_EQ(cp.size(), 3u);
  ASSERT_EQ(pp.size(), 3u);
  ASSERT_EQ(balanced.size(), 3u);
  for (int s = 0; s < 3; ++s) {
    EXPECT_NEAR(sharded[s], one[s], 1e-5 * one[s]) << "tp2 dp2 zero3, step " << s + 1;
    EXPECT_NEAR(sp[s], one[s], 1e-5 * one[s]) << "tp2 sp, step " << s + 1;
    EXPECT_NEAR(cp[s], one[s], 1e-5 * one[s]) << "tp2 cp2 sp, step " << s + 1;
    EXPECT_NEAR(pp[s], one[s], 1e-5 * one[s]) << "pp2 dp2 zero1, step " << s + 1;
    EXPECT_NEAR(balanced[s], one[s], 1e-5 * one[s]) << "pp2 dp2 zero1, stage_layers auto, step " << s + 1;
  }
  EXPECT_LT(one[2], one[0]);
}

// N steps straight equal k steps, kill -9 of an executor, the restarted attempt resuming
// from the checkpoint of step k, N - k steps (bit for bit: same layout, same data); a
// third job in another layout (tp2 instead of dp2) starts from that checkpoint and
// matches within 1e-5; a checkpoint directory outside the controller's path roots is
// refused at submit.
TEST(Cluster, KilledTrainingResumesFromItsCheckpoint) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  constexpr int kSteps = 40;
  auto run = [&](const v1::JobSpec& spec, std::function<void(const std::string&)> during = nullptr) {
    std::string id = Submit(*c, spec);
    if (during) during(id);
    auto job = c->WaitState(id, v1::JOB_STATE_SUCCEEDED, 120000);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  };
  auto losses = [](const v1::Job& j) {
    auto r = nlohmann::json::parse(j.result_json(), nullptr, false);
    return r.is_discarded() ? std::vector<double>{} : r["losses"].get<std::vector<double>>();
  };
  const auto straight = losses(run(PretrainSpec(2, 1, 1, kSteps)));
  ASSERT_EQ(straight.size(), size_t(kSteps));

  const std::string dir = c->dir() + "/ckpt";
  v1::JobSpec spec = PretrainSpec(2, 1, 1, kSteps);
  spec.mutable_train()->mutable_checkpoint()->set_dir(dir);
  spec.mutable_train()->mutable_checkpoint()->set_save_every(4);
  spec.set_max_restarts(1);
  spec.set_restart_backoff_s(0.2);
  const v1::Job resumed = run(spec, [&](const std::string& id) {
    auto pids = RunningExecutors(*c, id, 1, 2);
    ASSERT_EQ(pids.size(), 2u);
    for (int i = 0; i < 3000 && !ReadFile(dir + "/latest").ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_EQ(kill(pids[1], SIGKILL), 0);
  });
  EXPECT_EQ(resumed.attempt(), 2) << "the kill came after the job ended: make the steps more or slower";
  const auto r = nlohmann::json::parse(resumed.result_json());
  const int first = r["first_step"].get<int>();
  EXPECT_GT(first, 1);
  std::cout << "resumed at step " << first << " of " << kSteps << "\n";
  EXPECT_EQ((first - 1) % 4, 0);
  const auto tail = r["losses"].get<std::vector<double>>();
  ASSERT_EQ(tail.size(), size_t(kSteps - first + 1));
  for (size_t i = 0; i < tail.size(); ++i) EXPECT_EQ(tail[i], straight[first - 1 + i]) << "step " << first + i;
  EXPECT_EQ(*ReadFile(dir + "/latest"), absl::StrFormat("step-%08d\n", kSteps));

  v1::JobSpec other = PretrainSpec(2, 2, 0, kSteps);  // tp2, one DP rank
  other.mutable_train()->mutable_checkpoint()->set_load(dir + "/step-00000008");
  const auto resharded = losses(run(other));
  ASSERT_EQ(resharded.size(), size_t(kSteps - 8));
  for (size_t i = 0; i < resharded.size(); ++i)
    EXPECT_NEAR(resharded[i], straight[8 + i], 1e-5 * straight[8 + i]) << "step " << 9 + i;

  // train.checkpoint.keep through the executors: 12 steps saved every 4 with keep 2
  // leave steps 8 and 12.
  v1::JobSpec kept = PretrainSpec(2, 1, 1, 12);
  kept.mutable_train()->mutable_checkpoint()->set_dir(c->dir() + "/kept");
  kept.mutable_train()->mutable_checkpoint()->set_save_every(4);
  kept.mutable_train()->mutable_checkpoint()->set_keep(2);
  EXPECT_EQ(run(kept).state(), v1::JOB_STATE_SUCCEEDED);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(c->dir() + "/kept")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_THAT(names, ::testing::ElementsAre("latest", "step-00000008", "step-00000012"));

  v1::JobSpec outside = PretrainSpec(2, 1, 1, kSteps);
  outside.mutable_train()->mutable_checkpoint()->set_dir("/etc/tessera-ckpt");
  auto refused = c->client().Submit(outside, "");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("train.checkpoint.dir"));
}

// A job (pp2 x dp2 ZeRO-3: the stages send their parameters to the first, which writes)
// exports its model as a Hugging Face directory after its last step; another job (tp2,
// with activation recomputation) starts from that directory: its first loss is far below
// a fresh model's (ln 256 = 5.55) and near the first job's last one.
TEST(Cluster, PretrainExportsAndStartsFromAHuggingFaceDirectory) {
  auto c = Up({.agents = 1, .cpu_slots = 4});
  const std::string hf = c->dir() + "/hf-export";
  v1::JobSpec first = PretrainSpec(4, 1, 3, 30, /*sp=*/false, /*cp=*/1, /*pp=*/2);
  first.mutable_train()->set_export_hf(hf);
  auto a = c->WaitState(Submit(*c, first), v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(a.ok()) << a.status();
  const auto la = nlohmann::json::parse(a->result_json())["losses"].get<std::vector<double>>();
  ASSERT_TRUE(ReadFile(hf + "/config.json").ok());
  ASSERT_TRUE(ReadFile(hf + "/model.safetensors").ok());
  v1::JobSpec second = PretrainSpec(2, 2, 0, 2);
  auto* m = second.mutable_model();
  for (auto clear : {&v1::ModelShape::clear_hidden, &v1::ModelShape::clear_num_layers, &v1::ModelShape::clear_num_heads,
                     &v1::ModelShape::clear_num_kv_heads, &v1::ModelShape::clear_vocab_size, &v1::ModelShape::clear_ffn,
                     &v1::ModelShape::clear_head_dim, &v1::ModelShape::clear_qkv_bias})
    (m->*clear)();
  m->set_hf_dir(hf);
  second.mutable_train()->set_recompute(true);
  auto b = c->WaitState(Submit(*c, second), v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(b.ok()) << b.status();
  const auto lb = nlohmann::json::parse(b->result_json())["losses"].get<std::vector<double>>();
  ASSERT_EQ(lb.size(), 2u);
  EXPECT_LT(lb[0], 0.75 * std::log(256.0)) << "first job's last loss " << la.back();
  EXPECT_NEAR(lb[0], la.back(), 0.25 * la.back());
}

// An sft job on a JSONL file (the example data, copied under the controller's path root):
// it runs and learns; a path outside the roots is refused at submit.
TEST(Cluster, SftTrainsOnJsonlData) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  auto data = ReadFile(std::string(TESSERA_SOURCE_DIR) + "/examples/data/addition-sft.jsonl");
  ASSERT_TRUE(data.ok()) << data.status();
  const std::string path = c->dir() + "/addition-sft.jsonl";
  ASSERT_TRUE(WriteFileAtomic(path, *data).ok());
  v1::JobSpec spec = PretrainSpec(2, 1, 1, 30);
  spec.set_kind("sft");
  spec.mutable_train()->mutable_data()->set_kind("jsonl");
  spec.mutable_train()->mutable_data()->set_path(path);
  auto job = c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(job.ok()) << job.status();
  const auto losses = nlohmann::json::parse(job->result_json())["losses"].get<std::vector<double>>();
  ASSERT_EQ(losses.size(), 30u);
  double tail = 0;
  for (int i = 25; i < 30; ++i) tail += losses[i] / 5;
  EXPECT_LT(tail, 0.85 * losses.front()) << "first " << losses.front();  // seen: 5.7 -> 4.4
  spec.mutable_train()->mutable_data()->set_path("/etc/passwd");
  auto refused = c->client().Submit(spec, "");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("train.data.path"));
}

// A grpo job through the daemons (dp2 on two CPU slots, random start): every step streams
// the GRPO metrics, the job succeeds, and its result lists one reward per step and the
// held-out accuracy at the start and the end (the DP ranks' shares summed).
TEST(Cluster, GrpoStepsStreamTheirMetrics) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  v1::JobSpec spec = PretrainSpec(2, 1, 0, 2);
  spec.set_kind("grpo");
  spec.mutable_train()->mutable_data()->set_digits(1);
  spec.mutable_rl()->set_group_size(4);
  spec.mutable_rl()->set_prompts_per_step(4);
  spec.mutable_rl()->set_kl_coef(0.01);
  spec.mutable_rl()->set_entropy_coef(0.001);  // the bonus's gradient runs through the job
  spec.mutable_rl()->set_eval_problems(11);  // split 6 + 5 over the two DP ranks
  std::ostringstream progress;
  auto job = c->client().Watch(Submit(*c, spec), progress);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason() << "\n" << progress.str();
  EXPECT_THAT(progress.str(), HasSubstr("step 2/2 reward"));
  for (const char* k : {"reward=", "accuracy=", "response_length=", "kl=", "clip_fraction=", "entropy=", "grad_norm=", "generate_s=",
                        "ref_s=", "old_logprob_s=", "update_s=", "samples_per_s=", "generate_tokens_per_s=",
                        "train_tokens_per_s=", "rollout_peak_gib=", "actor_peak_gib=", "kv_cache_gib="})
    EXPECT_THAT(progress.str(), HasSubstr(k));
  EXPECT_THAT(progress.str(), HasSubstr("held-out accuracy at the start"));
  const auto result = nlohmann::json::parse(job->result_json());
  EXPECT_EQ(result["rewards"].size(), 2u);
  // Held-out accuracy before the first step and after the last (eval_every 10 > 2 steps).
  ASSERT_EQ(result["accuracy"].size(), 2u) << result.dump();
  EXPECT_EQ(result["accuracy"][0]["step"], 0);
  EXPECT_EQ(result["accuracy"][1]["step"], 2);
  for (const auto& e : result["accuracy"]) {
    EXPECT_GE(e["accuracy"].get<double>(), 0.0);
    EXPECT_LE(e["accuracy"].get<double>(), 1.0);
  }
}

// A rollout group of `devices` ranks (dp = devices) — on devices of its own, or on the
// actor's with `colocate_with` — added to `spec` and the spec validated.
v1::GroupSpec* AddRolloutGroup(v1::JobSpec& spec, int devices, const std::string& colocate_with = "") {
  auto* g = spec.add_groups();
  g->set_name("rollout"), g->set_role("rollout"), g->set_devices(devices), g->set_colocate_with(colocate_with);
  g->mutable_layout()->set_dp(devices);
  const absl::Status st = NormalizeAndValidateJobSpec(spec);
  EXPECT_TRUE(st.ok()) << st;
  return g;
}

// Split pools: the same grpo job with its rollout on devices of its own (a second group,
// role rollout, dp 2; the bridge communicator over all four ranks) samples what the
// colocated job samples — every prompt with the seed its actor rank would use — so its
// per-step rewards, gradient norms and KLs and its held-out accuracy equal the colocated
// run's; the driver checks the pool's weights against the actor's by digest after the
// first and the last sync (weights_verified). A pool of one rank samples the same; a
// pool of another TP layout (tp 2: the sync re-slices) runs and verifies too.
TEST(Cluster, GrpoWithARolloutPoolOfItsOwnEqualsColocated) {
  auto c = Up({.agents = 1, .cpu_slots = 4});
  v1::JobSpec spec = SmallRlSpec("grpo");
  spec.mutable_rl()->set_eval_every(2);
  auto colocated = c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(colocated.ok()) << colocated.status();
  {
    const auto a = nlohmann::json::parse(colocated->result_json());
    for (size_t i = 0; i < 3; ++i) ASSERT_GT(a["grad_norms"][i].get<double>(), 0) << a.dump();
    ASSERT_GT(a["kl"][2].get<double>(), 0) << a.dump();
  }
  auto* pool = AddRolloutGroup(spec, 2);
  std::ostringstream progress;
  auto split = c->client().Watch(Submit(*c, spec), progress);
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_EQ(split->state(), v1::JOB_STATE_SUCCEEDED) << split->reason() << "\n" << progress.str();
  const auto a = nlohmann::json::parse(colocated->result_json()), b = nlohmann::json::parse(split->result_json());
  // The same samples: the same rewards, and the gradient norms and KLs (which depend on
  // every sampled token) agree to float precision.
  auto same_run = [&](const nlohmann::json& x, const char* what) {
    ASSERT_EQ(x["rewards"].size(), 3u) << what;
    EXPECT_EQ(x["rewards"], a["rewards"]) << what;
    EXPECT_EQ(x["accuracy"], a["accuracy"]) << what;
    for (const char* k : {"grad_norms", "kl"})
      for (size_t i = 0; i < 3; ++i)
        EXPECT_NEAR(x[k][i].get<double>(), a[k][i].get<double>(), 1e-6 * std::abs(a[k][i].get<double>()) + 1e-9)
            << what << " " << k << " " << i;
  };
  same_run(b, "pool dp 2");
  EXPECT_EQ(b["weights_verified"], true);
  EXPECT_GT(b["sync_bytes"].get<int64_t>(), 0);
  for (const char* k : {"generate_s=", "update_s=", "sync_s=", "sync_gb_per_s=", "ref_s=", "old_logprob_s=", "actor_update_s="})
    EXPECT_THAT(progress.str(), HasSubstr(k));
  EXPECT_THAT(progress.str(), HasSubstr("weights synced"));
  // A pool of one rank generates every prompt, each still with its actor rank's seed:
  // the same samples again.
  pool->set_devices(1), pool->mutable_layout()->set_dp(1);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok());
  auto one = c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(one.ok()) << one.status();
  same_run(nlohmann::json::parse(one->result_json()), "pool of one rank");
  // A pool with tensor parallelism: the sync re-slices every tensor.
  pool->set_devices(2), pool->mutable_layout()->set_dp(1), pool->mutable_layout()->set_tp(2);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok());
  auto tp2 = c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(tp2.ok()) << tp2.status();
  EXPECT_EQ(nlohmann::json::parse(tp2->result_json())["weights_verified"], true);
  // Refusals name the field.
  pool->mutable_layout()->set_tp(1), pool->mutable_layout()->set_pp(2);
  EXPECT_THAT(std::string(NormalizeAndValidateJobSpec(spec).message()), HasSubstr("groups[1].layout: a rollout group runs tp x dp"));
  pool->mutable_layout()->set_pp(1), pool->mutable_layout()->set_dp(2);
  pool->set_role("worker");
  EXPECT_THAT(std::string(NormalizeAndValidateJobSpec(spec).message()), HasSubstr("groups[1].role"));
}

// A rollout group on the actor's devices with a layout of its own (colocate_with: verl's
// resharding hybrid engine): each executor re-slices the actor's weights into its rollout
// model (gathered over the actor's TP group, one tensor at a time; no bridge). With the
// actor's own layout it samples exactly what the rollout on the actor's own model does;
// actor tp 2 -> rollout tp 1 (dp 2) and actor dp 2 -> rollout tp 2 run, and the driver's
// digests find the rollout's weights equal to the actor's after the first and last sync.
TEST(Cluster, GrpoWithARolloutGroupOnTheActorsDevicesReslicesTheWeights) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  v1::JobSpec spec = SmallRlSpec("grpo");
  auto own = c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(own.ok()) << own.status();
  const auto a = nlohmann::json::parse(own->result_json());
  auto* rollout = AddRolloutGroup(spec, 2, "actor");
  std::ostringstream progress;
  auto same = c->client().Watch(Submit(*c, spec), progress);
  ASSERT_TRUE(same.ok()) << same.status();
  ASSERT_EQ(same->state(), v1::JOB_STATE_SUCCEEDED) << same->reason() << "\n" << progress.str();
  EXPECT_THAT(progress.str(), HasSubstr("on the actor's devices"));
  const auto b = nlohmann::json::parse(same->result_json());
  EXPECT_EQ(b["rewards"], a["rewards"]);
  EXPECT_EQ(b["accuracy"], a["accuracy"]);
  for (const char* k : {"grad_norms", "kl"})
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_GT(a[k][i].get<double>() + (i == 0 && std::string(k) == "kl"), 0) << k << " " << i;
      EXPECT_NEAR(b[k][i].get<double>(), a[k][i].get<double>(), 1e-6 * std::abs(a[k][i].get<double>()) + 1e-9) << k << " " << i;
    }
  EXPECT_EQ(b["weights_verified"], true);
  // TP 2 -> 1: the actor's shards gathered, the whole tensors kept by each rollout rank.
  spec.mutable_groups(0)->mutable_layout()->set_tp(2), spec.mutable_groups(0)->mutable_layout()->set_dp(1);
  spec.mutable_rl()->set_prompts_per_step(2);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  auto down = c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_EQ(nlohmann::json::parse(down->result_json())["weights_verified"], true);
  // DP 2 -> TP 2: each rollout rank keeps its half of every sharded tensor.
  spec.mutable_groups(0)->mutable_layout()->set_tp(1), spec.mutable_groups(0)->mutable_layout()->set_dp(2);
  rollout->mutable_layout()->set_dp(1), rollout->mutable_layout()->set_tp(2);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  auto up = c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_EQ(nlohmann::json::parse(up->result_json())["weights_verified"], true);
}

// ppo with a rollout pool of its own (the critic stays with the actor): the same samples
// as the colocated job, so the same rewards, gradient norms, KLs and accuracy.
TEST(Cluster, PpoWithARolloutPoolOfItsOwnEqualsColocated) {
  auto c = Up({.agents = 1, .cpu_slots = 4});
  v1::JobSpec spec = SmallRlSpec("ppo");
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  auto colocated = c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(colocated.ok()) << colocated.status();
  const auto a = nlohmann::json::parse(colocated->result_json());
  for (size_t i = 0; i < 3; ++i) ASSERT_GT(a["grad_norms"][i].get<double>(), 0) << a.dump();
  AddRolloutGroup(spec, 2);
  std::ostringstream progress;
  auto split = c->client().Watch(Submit(*c, spec), progress);
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_EQ(split->state(), v1::JOB_STATE_SUCCEEDED) << split->reason() << "\n" << progress.str();
  const auto b = nlohmann::json::parse(split->result_json());
  EXPECT_EQ(b["rewards"], a["rewards"]);
  EXPECT_EQ(b["accuracy"], a["accuracy"]);
  for (const char* k : {"grad_norms", "kl"})
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(b[k][i].get<double>(), a[k][i].get<double>(), 1e-6 * std::abs(a[k][i].get<double>()) + 1e-9) << k << " " << i;
  EXPECT_EQ(b["weights_verified"], true);
  for (const char* k : {"value_loss=", "critic_grad_norm=", "values_s=", "critic_update_s=", "reward_kl=", "sync_s=",
                        "rollout_engine_s=", "prefill_s=", "decode_s=", "graph_steps="})
    EXPECT_THAT(progress.str(), HasSubstr(k));
}

TEST(Cluster, PpoStepsStreamTheCriticsMetrics) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  v1::JobSpec spec = PretrainSpec(2, 1, 0, 2);
  spec.set_kind("ppo");
  spec.mutable_train()->mutable_data()->set_digits(1);
  spec.mutable_rl()->set_group_size(2);
  spec.mutable_rl()->set_prompts_per_step(4);
  spec.mutable_rl()->set_kl_reward_coef(0.01);  // the reference's log-probs in the reward
  spec.mutable_rl()->set_eval_problems(11);
  std::ostringstream progress;
  auto job = c->client().Watch(Submit(*c, spec), progress);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason() << "\n" << progress.str();
  EXPECT_THAT(progress.str(), HasSubstr("ready for PPO"));
  for (const char* k : {"reward=", "value_loss=", "value_clip_fraction=", "critic_grad_norm=", "values_s=",
                        "critic_update_s=", "kl=", "entropy=", "reward_kl="})
    EXPECT_THAT(progress.str(), HasSubstr(k));
  const auto result = nlohmann::json::parse(job->result_json());
  EXPECT_EQ(result["rewards"].size(), 2u);
}

// ppo checkpoints: 2 steps saved into a directory (the critic under dir/critic, same
// step), then the same job with 4 steps resumes at step 3 — and steps 3 and 4 repeat a
// straight 4-step run's rewards and both gradient norms exactly (constant LR; the critic
// decides step 3's advantages, so without its checkpoint they would differ).
TEST(Cluster, PpoResumesActorAndCriticFromItsCheckpoint) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  auto spec_of = [&](int steps) {
    v1::JobSpec spec = PretrainSpec(2, 1, 0, steps);
    spec.set_kind("ppo");
    spec.mutable_train()->mutable_data()->set_digits(1);
    spec.mutable_train()->set_lr(1e-2), spec.mutable_train()->set_min_lr(1e-2), spec.mutable_train()->set_warmup_steps(0);
    spec.mutable_rl()->set_group_size(2);
    spec.mutable_rl()->set_prompts_per_step(4);
    spec.mutable_rl()->set_eval_problems(4);
    return spec;
  };
  auto run = [&](const v1::JobSpec& spec) {
    std::ostringstream progress;
    auto job = c->client().Watch(Submit(*c, spec), progress);
    EXPECT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job.ok() ? job->state() : v1::JOB_STATE_FAILED, v1::JOB_STATE_SUCCEEDED) << (job.ok() ? job->reason() : "") << progress.str();
    return job.ok() ? nlohmann::json::parse(job->result_json(), nullptr, false) : nlohmann::json();
  };
  const auto straight = run(spec_of(4));
  ASSERT_EQ(straight["grad_norms"].size(), 4u) << straight.dump();
  const std::string dir = c->dir() + "/ppo-ckpt";
  v1::JobSpec first = spec_of(2);
  first.mutable_train()->mutable_checkpoint()->set_dir(dir);
  run(first);
  EXPECT_TRUE(ReadFile(dir + "/critic/latest").ok());
  EXPECT_TRUE(ReadFile(dir + "/latest").ok());
  v1::JobSpec second = spec_of(4);
  second.mutable_train()->mutable_checkpoint()->set_dir(dir);
  const auto resumed = run(second);
  ASSERT_EQ(resumed["first_step"], 3) << resumed.dump();
  ASSERT_EQ(resumed["grad_norms"].size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(resumed["rewards"][k], straight["rewards"][k + 2]) << "step " << k + 3;
    EXPECT_EQ(resumed["grad_norms"][k], straight["grad_norms"][k + 2]) << "step " << k + 3;
  }
}

TEST(Cluster, KilledExecutorRestartsTheAttempt) {
  auto c = Up({.agents = 2, .cpu_slots = 2});
  std::string id = Submit(*c, CommCheckSpec(4, 2, 1, 1, 20));
  auto pids = RunningExecutors(*c, id, 1, 4);
  ASSERT_EQ(pids.size(), 4u);
  ASSERT_EQ(kill(pids[1], SIGKILL), 0);
  auto j = c->WaitState(id, v1::JOB_STATE_SUCCEEDED, 90000);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->attempt(), 2);
  EXPECT_EQ(j->restarts(), 1);
  // The old attempt's executors are all gone, and the stale attempt is refused.
  EXPECT_TRUE(Cluster::ExecutorPids(id, 1).empty());
  std::string cfg_path;
  for (int a = 0; a < 2 && cfg_path.empty(); ++a)
    for (int x = 0; x < 4; ++x) {
      std::string p = absl::StrCat(c->agent_work_dir(a), "/jobs/", id, "/attempt-1/executor-", x, ".pb");
      if (ReadFile(p).ok()) { cfg_path = p; break; }
    }
  ASSERT_FALSE(cfg_path.empty());
  v1::ExecutorConfig old;
  ASSERT_TRUE(old.ParseFromString(*ReadFile(cfg_path)));
  ChannelOptions co;
  co.address = c->address();
  co.ca_pem = c->ca_pem();
  auto ch = MakeChannel(co);
  auto stub = v1::RendezvousService::NewStub(*ch);
  grpc::ClientContext ctx;
  PrepareContext(ctx, old.secret(), 5000);
  v1::SetRequest req;
  req.mutable_scope()->set_job_id(id);
  req.mutable_scope()->set_attempt(1);
  req.set_key("x");
  v1::SetResponse resp;
  auto st = stub->Set(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::FAILED_PRECONDITION) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("attempt 1 is stale"));
}

// The driver's calls name the executor they are meant for: one that reaches another
// executor (a port answered by the wrong process) is refused there and logged, with the
// attempt's right secret too, and the job goes on.
TEST(Cluster, AnExecutorRefusesACallMeantForAnother) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  std::string id = Submit(*c, CommCheckSpec(2, 2, 1, 0, 5000));
  ASSERT_EQ(RunningExecutors(*c, id, 1, 2).size(), 2u);
  v1::ExecutorConfig cfg;
  ASSERT_TRUE(cfg.ParseFromString(*ReadFile(absl::StrCat(c->agent_work_dir(0), "/jobs/", id, "/attempt-1/executor-0.pb"))));
  std::string address;
  const std::regex serving("serving ExecutorService on (\\S+)");
  for (int i = 0; i < 1000 && address.empty(); ++i) {
    std::ostringstream logs;
    (void)c->client().Logs(id, 0, 0, false, logs);
    std::smatch m;
    const std::string text = logs.str();
    if (std::regex_search(text, m, serving)) address = m[1];
    else std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(address.empty()) << "executor 0 never logged its address";
  ChannelOptions co;
  co.address = address;
  co.ca_pem = c->ca_pem();
  co.tls_name_override = kExecutorTlsName;
  auto ch = MakeChannel(co);
  ASSERT_TRUE(ch.ok()) << ch.status();
  auto stub = v1::ExecutorService::NewStub(*ch);
  for (const char* to : {"1", ""}) {
    grpc::ClientContext ctx;
    PrepareContext(ctx, cfg.secret(), 10000);
    if (*to) ctx.AddMetadata(kExecutorMetadata, to);
    v1::InitGroupRequest req;
    req.set_group("workers");
    v1::InitGroupResponse resp;
    auto st = stub->InitGroup(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::FAILED_PRECONDITION) << to << ": " << st.error_message();
    EXPECT_THAT(st.error_message(),
                HasSubstr(absl::StrCat("this is executor 0 of job ", id, " attempt 1; the call was meant for executor '", to, "'")));
  }
  auto j = c->client().Get(id);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_TRUE(j->state() == v1::JOB_STATE_RUNNING || j->state() == v1::JOB_STATE_SUCCEEDED) << v1::JobState_Name(j->state()) << " " << j->reason();
  for (int i = 0; i < 500; ++i) {  // the executor's own record of it
    std::ostringstream logs;
    (void)c->client().Logs(id, 0, 0, false, logs);
    if (absl::StrContains(logs.str(), "refused a call from")) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "executor 0 did not log the refused calls";
}

TEST(Cluster, KilledExecutorWithoutRestartsFailsNamingRankAndNode) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  std::string id = Submit(*c, CommCheckSpec(2, 2, 1, 0, 20));
  auto pids = RunningExecutors(*c, id, 1, 2);
  ASSERT_EQ(pids.size(), 2u);
  kill(pids[0], SIGKILL);
  auto j = c->WaitState(id, v1::JOB_STATE_FAILED, 60000);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_THAT(j->reason(), HasSubstr("on node n0 was killed by signal 9"));
  EXPECT_THAT(j->reason(), HasSubstr("workers rank"));
}

TEST(Cluster, KilledAgentLosesItsNodeAfterTheLease) {
  auto c = Up({.agents = 2, .cpu_slots = 2, .lease_s = 2});
  std::string id = Submit(*c, CommCheckSpec(4, 2, 1, 0, 20));
  RunningExecutors(*c, id, 1, 4);
  c->agents()[1]->Kill(SIGKILL);
  c->agents()[1]->Wait(2000);
  auto j = c->WaitState(id, v1::JOB_STATE_FAILED, 60000);
  ASSERT_TRUE(j.ok()) << j.status();
  auto st = c->client().Status();
  ASSERT_TRUE(st.ok());
  bool lost = false;
  for (const auto& n : st->nodes()) lost |= n.node_id() == "n1" && n.state() == v1::NODE_STATE_LOST;
  EXPECT_TRUE(lost);
  // The job's reason names what went first: the node, or an executor on it.
  EXPECT_THAT(j->reason(), ::testing::AnyOf(HasSubstr("node n1"), HasSubstr("executor")));
}

// A plaintext health check of `service` at addr ("" the server as a whole).
grpc::health::v1::HealthCheckResponse::ServingStatus Health(const std::string& addr, const std::string& service) {
  ChannelOptions o;
  o.address = addr;
  o.insecure = true;
  auto ch = MakeChannel(o);
  auto stub = grpc::health::v1::Health::NewStub(*ch);
  grpc::ClientContext ctx;
  PrepareContext(ctx, "", 5000);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  return stub->Check(&ctx, req, &resp).ok() ? resp.status() : grpc::health::v1::HealthCheckResponse::UNKNOWN;
}

TEST(Cluster, ControllerRestartMidJobLosesNothingAndLaunchesNothingTwice) {
  auto c = Up({.agents = 2, .cpu_slots = 2, .lease_s = 4});
  std::string id = Submit(*c, CommCheckSpec(4, 2, 1, 0, 10));
  RunningExecutors(*c, id, 1, 4);
  const std::string agent = absl::StrCat("127.0.0.1:", c->agent_health_port());
  using HS = grpc::health::v1::HealthCheckResponse;
  EXPECT_EQ(Health(agent, ""), HS::SERVING);
  EXPECT_EQ(Health(agent, "liveness"), HS::SERVING);
  c->controller().Kill(SIGKILL);
  c->controller().Wait(2000);
  // Without its controller the agent is not ready, but alive (its probe must not get it,
  // and its executors, restarted).
  bool unready = false;
  for (int i = 0; i < 200 && !unready; ++i) {
    unready = Health(agent, "") == HS::NOT_SERVING;
    if (!unready) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_TRUE(unready);
  EXPECT_EQ(Health(agent, "liveness"), HS::SERVING);
  ASSERT_TRUE(c->StartController().ok());
  auto j = c->WaitState(id, v1::JOB_STATE_SUCCEEDED, 90000);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->attempt(), 2);
  EXPECT_EQ(j->restarts(), 0);
  ASSERT_TRUE(c->WaitNodes(2, 10000).ok());  // agents re-registered
  // Exactly one executor per rank was launched for attempt 2, and no attempt 3.
  int configs = 0;
  for (int a = 0; a < 2; ++a)
    for (int x = 0; x < 4; ++x) {
      configs += ReadFile(absl::StrCat(c->agent_work_dir(a), "/jobs/", id, "/attempt-2/executor-", x, ".pb")).ok();
      EXPECT_FALSE(ReadFile(absl::StrCat(c->agent_work_dir(a), "/jobs/", id, "/attempt-3/executor-", x, ".pb")).ok());
    }
  EXPECT_EQ(configs, 4);
  EXPECT_EQ(c->client().List(100)->size(), 1u);
  // The job's events before the kill are still there, in order, with the new start's.
  std::ostringstream events;
  ASSERT_TRUE(c->client().Watch(id, events).ok());
  const std::string text = events.str();
  const size_t first = text.find("RUNNING (attempt 1)"), restarting = text.find("RESTARTING (attempt 1)"),
               second = text.find("RUNNING (attempt 2)"), done = text.find("SUCCEEDED (attempt 2)");
  EXPECT_NE(text.find("PENDING (attempt"), std::string::npos) << text;
  ASSERT_NE(first, std::string::npos) << text;
  ASSERT_NE(restarting, std::string::npos) << text;
  ASSERT_NE(second, std::string::npos) << text;
  ASSERT_NE(done, std::string::npos) << text;
  EXPECT_LT(first, restarting);
  EXPECT_LT(restarting, second);
  EXPECT_LT(second, done);
}

TEST(Cluster, BadInputIsRejectedAndDisturbsNothing) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  std::string running = Submit(*c, CommCheckSpec(2, 2, 1, 0, 5));
  auto expect = [&](v1::JobSpec spec, grpc::StatusCode code, const std::string& text) {
    auto r = c->client().Submit(spec, "");
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(static_cast<int>(r.status().code()), static_cast<int>(code)) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(text));
  };
  auto spec = CommCheckSpec(2, 2, 1, 0);
  auto bad = spec;
  bad.mutable_groups(0)->set_devices(3);
  expect(bad, grpc::INVALID_ARGUMENT, "groups[0]: layout: the group has 3 devices but tp*cp*dp*pp = 2*1*1*1 = 2");
  bad = spec;
  bad.mutable_groups(0)->mutable_layout()->set_vpp(2);
  expect(bad, grpc::INVALID_ARGUMENT, "vpp=2 (virtual pipeline stages) requires pp >= 2");
  bad = spec;
  bad.mutable_groups(0)->set_devices(8);
  bad.mutable_groups(0)->mutable_layout()->set_dp(4);
  expect(bad, grpc::RESOURCE_EXHAUSTED, "can never fit this cluster");
  bad = spec;
  bad.set_name("");
  expect(bad, grpc::INVALID_ARGUMENT, "name: is required");
  bad = spec;
  (*bad.mutable_env())["X"] = std::string(20 << 20, 'x');
  expect(bad, grpc::RESOURCE_EXHAUSTED, "");
  // Auth: no token, a wrong token, a read-only token.
  auto anon = c->ClientWithToken("");
  EXPECT_EQ((*anon)->Submit(spec, "").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*anon)->List(10).status().code(), absl::StatusCode::kUnauthenticated);
  auto wrong = c->ClientWithToken(std::string(32, 'a'));
  EXPECT_EQ((*wrong)->List(10).status().code(), absl::StatusCode::kUnauthenticated);
  auto reader = c->ClientWithToken(c->read_token());
  EXPECT_TRUE((*reader)->List(10).ok());
  EXPECT_EQ((*reader)->Submit(spec, "").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ((*reader)->Stop(running).status().code(), absl::StatusCode::kPermissionDenied);
  // A token of the wrong kind: the agents' join token is not a client's token.
  auto join = ReadFile(c->dir() + "/controller/join-token");
  ASSERT_TRUE(join.ok());
  auto joiner = c->ClientWithToken(std::string(absl::StripAsciiWhitespace(*join)));
  EXPECT_EQ((*joiner)->List(10).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*joiner)->Submit(spec, "").status().code(), absl::StatusCode::kUnauthenticated);
  // Paths that escape the controller's roots (the test cluster's root is its directory).
  auto escaping = PretrainSpec(2, 1, 0, 2);
  escaping.mutable_train()->mutable_checkpoint()->set_dir(c->dir() + "/../elsewhere");
  expect(escaping, grpc::INVALID_ARGUMENT, "train.checkpoint.dir");
  escaping.mutable_train()->mutable_checkpoint()->set_dir("/etc/tessera-checkpoints");
  expect(escaping, grpc::PERMISSION_DENIED, "train.checkpoint.dir: '/etc/tessera-checkpoints' is outside");
  // Nothing was persisted for the rejected jobs; the running job finishes normally.
  EXPECT_EQ(c->client().List(100)->size(), 1u);
  auto j = c->WaitState(running, v1::JOB_STATE_SUCCEEDED, 60000);
  EXPECT_TRUE(j.ok()) << j.status();
  // Plaintext to the TLS port fails; TLS without the right CA fails.
  auto pc = client::Client::Connect({c->address(), c->admin_token(), "", true});
  EXPECT_FALSE((*pc)->List(1).ok());
}

// An agent's input is checked before it is trusted: a node id that is not a plain name is
// refused; failed joins are logged with the peer's address (never the token offered), at
// most a line per peer every 10 s however often it knocks. The controller's state dir is
// private (0700) whatever it was made with.
TEST(Cluster, AgentsInputIsCheckedAndFailedJoinsAreLoggedRateLimited) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  auto ch = MakeChannel({c->address(), c->ca_pem(), false});
  ASSERT_TRUE(ch.ok());
  auto stub = v1::NodeService::NewStub(*ch);
  const std::string join = std::string(absl::StripAsciiWhitespace(*ReadFile(c->dir() + "/controller/join-token")));
  auto reg = [&](const std::string& token, const std::string& node) {
    grpc::ClientContext ctx;
    PrepareContext(ctx, token, 5000);
    v1::RegisterNodeRequest req;
    req.set_node_id(node), req.set_address("127.0.0.1"), req.set_incarnation(1);
    v1::RegisterNodeResponse resp;
    return stub->RegisterNode(&ctx, req, &resp);
  };
  for (int i = 0; i < 40; ++i) EXPECT_EQ(reg("wrong-token-" + std::to_string(i), "x").error_code(), grpc::UNAUTHENTICATED);
  for (const char* bad : {"../../etc", "a/b", "-n", ""}) {
    auto st = reg(join, bad);
    EXPECT_EQ(st.error_code(), grpc::INVALID_ARGUMENT) << bad;
    EXPECT_THAT(st.error_message(), HasSubstr("node_id:"));
  }
  const std::string log = *ReadFile(c->dir() + "/controller.log");
  size_t lines = 0;
  for (size_t at = log.find("refused an agent join from ipv4:127.0.0.1:"); at != std::string::npos;
       at = log.find("refused an agent join from", at + 1))
    ++lines;
  EXPECT_GE(lines, 1u);
  EXPECT_LE(lines, 2u) << "40 failed joins should not make 40 log lines";
  EXPECT_THAT(log, ::testing::Not(HasSubstr("wrong-token-")));
  struct stat st {};
  ASSERT_EQ(stat((c->dir() + "/controller").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

// Kubernetes mounts the CA, the join token and the tokens as a Secret (deploy/k8s):
// `tessera-controller init-secrets` makes them once; a controller started with
// --secrets-dir reads them from there and writes none of them into its state dir; agents
// join with the CA and join token from the same place. A missing secret is a clear
// start-up error, and init-secrets never overwrites.
TEST(Cluster, ControllerRunsFromAMountedSecretsDirectory) {
  char tmpl[] = "/tmp/tessera-secrets-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string base = tmpl, secrets = base + "/secrets", ctl = std::string(TESSERA_BIN_DIR) + "/tessera-controller";
  auto run = [&](const std::string& args) {
    const int rc = system((ctl + " " + args + " > " + base + "/out 2>&1").c_str());
    return std::pair{WEXITSTATUS(rc), ReadFile(base + "/out").value_or("")};
  };
  auto [rc, out] = run("init-secrets --out " + secrets);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("kubectl -n tessera create secret generic tessera-join"));
  struct stat st {};
  ASSERT_EQ(stat((secrets + "/ca.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const std::string ca = *ReadFile(secrets + "/ca.crt");
  std::tie(rc, out) = run("init-secrets --out " + secrets);
  EXPECT_NE(rc, 0);
  EXPECT_THAT(out, HasSubstr("ca.crt exists"));
  EXPECT_EQ(*ReadFile(secrets + "/ca.crt"), ca);
  std::tie(rc, out) = run("--state-dir " + base + "/state --listen 127.0.0.1:0 --secrets-dir " + base + "/nothing");
  EXPECT_NE(rc, 0);
  EXPECT_THAT(out, HasSubstr("no ca.crt and ca.key (make them with `tessera-controller init-secrets"));
  {
    auto c = Up({.agents = 1, .cpu_slots = 2, .secrets_dir = secrets});
    auto j = c->WaitState(Submit(*c, CommCheckSpec(2, 2, 1, 0)), v1::JOB_STATE_SUCCEEDED, 60000);
    EXPECT_TRUE(j.ok()) << j.status();
    for (const char* f : {"ca.crt", "ca.key", "join-token", "tokens"})
      EXPECT_FALSE(ReadFile(c->dir() + "/controller/" + f).ok()) << f << " was written into the state dir";
    EXPECT_EQ(c->ca_pem(), ca);
  }
  system(("rm -rf " + base).c_str());
}

TEST(Cluster, CliSubmitStatusLogs) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  std::string conf = c->dir() + "/controller/admin.conf";
  std::string job_file = c->dir() + "/job.yaml";
  ASSERT_TRUE(WriteFileAtomic(job_file, "name: cli\nkind: comm-check\ngroups:\n  - {name: w, devices: 4, layout: {tp: 2}}\n"
                                        "comm_check: {sizes: [4KiB], iters: 2}\n").ok());
  std::string bin = std::string(TESSERA_BIN_DIR) + "/tessera --config " + conf;
  std::string out = c->dir() + "/cli.out";
  // Too big for 2 slots: rejected at submit, exit code non-zero, message names the problem.
  int rc = system((bin + " job submit -f " + job_file + " > " + out + " 2>&1").c_str());
  EXPECT_NE(WEXITSTATUS(rc), 0);
  EXPECT_THAT(*ReadFile(out), HasSubstr("can never fit"));
  rc = system((bin + " job submit -f " + job_file + " --set groups.0.devices=2 --set bogus=1 > " + out + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 2);
  EXPECT_THAT(*ReadFile(out), HasSubstr("bogus: unknown key"));
  rc = system((bin + " job submit -f " + job_file + " --set groups.0.devices=2 --submission-id s1 > " + out + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 0) << *ReadFile(out);
  EXPECT_THAT(*ReadFile(out), HasSubstr("SUCCEEDED"));
  EXPECT_THAT(*ReadFile(out), HasSubstr("all_reduce"));
  auto jobs = c->client().List(10);
  ASSERT_EQ(jobs->size(), 1u);
  std::string id = (*jobs)[0].job_id();
  // Resubmitting with the same submission id returns the same job.
  rc = system((bin + " job submit -f " + job_file + " --set groups.0.devices=2 --submission-id s1 --no-wait > " + out + " 2>&1").c_str());
  EXPECT_THAT(*ReadFile(out), HasSubstr("already submitted as " + id));
  rc = system((bin + " -o json job status " + id + " > " + out + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 0);
  EXPECT_EQ(nlohmann::json::parse(*ReadFile(out))["state"], "JOB_STATE_SUCCEEDED");
  rc = system((bin + " job logs " + id + " --rank 1 > " + out + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 0);
  EXPECT_THAT(*ReadFile(out), HasSubstr("[attempt 1 executor 1 n0]"));
  rc = system((bin + " status > " + out + " 2>&1").c_str());
  EXPECT_THAT(*ReadFile(out), HasSubstr("n0"));
  rc = system((std::string(TESSERA_BIN_DIR) + "/tessera --address " + c->address() + " --ca-cert " + c->dir() +
               "/controller/ca.crt job list > " + out + " 2>&1").c_str());
  EXPECT_NE(WEXITSTATUS(rc), 0);
  EXPECT_THAT(*ReadFile(out), HasSubstr("UNAUTHENTICATED"));
}

}  // namespace
}  // namespace tessera::testing
