// The one validator every submit path goes through (common/spec/job_spec_limits.h): bounds on
// every field, checked on the proto as any client builds it, before any arithmetic; and
// the size rules that keep products of fields from overflowing.
#include "common/spec/job_spec_limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <cmath>
#include <limits>

#include "common/spec/job_spec.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

constexpr char kPretrain[] = R"(
name: pt
kind: pretrain
groups:
  - {name: actor, devices: 4, layout: {tp: 2}}
model: {vocab_size: 256, hidden: 32, num_layers: 4, num_heads: 4, num_kv_heads: 2, ffn: 64, seq_len: 32,
        global_batch: 8, micro_batch: 2}
train: {steps: 3, lr: 1.0e-3}
)";

v1::JobSpec Parsed(const char* yaml = kPretrain) {
  auto s = ParseJobSpecYaml(yaml);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

std::string Refusal(v1::JobSpec spec) {
  auto st = NormalizeAndValidateJobSpec(spec);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  return std::string(st.message());
}

TEST(JobSpecLimits, EveryNumericFieldHasABound) {
  EXPECT_THAT(UnboundedJobSpecFields(), ::testing::IsEmpty());
}

// What a gRPC client can put in a JobSpec that the YAML parser never produced: every one
// refused by the validator, naming the field by its job-file path.
TEST(JobSpecLimits, AHandBuiltSpecMeetsTheSameRules) {
  struct Case {
    std::function<void(v1::JobSpec&)> edit;
    std::string want;
  } cases[] = {
      {[](v1::JobSpec& s) { s.set_max_restarts(-1); }, "max_restarts: must be in [0, 1000], got -1"},
      {[](v1::JobSpec& s) { s.set_collective_timeout_ms(-5000); }, "collective_timeout_s: must be in [0.1, 86400]"},
      {[](v1::JobSpec& s) { s.set_start_timeout_ms(-1); }, "start_timeout_s: must be in [1, 86400]"},
      {[](v1::JobSpec& s) { s.mutable_train()->set_warmup_steps(-3); }, "train.warmup_steps: must be in [0, 100000000], got -3"},
      {[](v1::JobSpec& s) { s.mutable_train()->set_min_lr(-1e-4); }, "train.min_lr: must be in [0, 10]"},
      {[](v1::JobSpec& s) { s.mutable_train()->set_weight_decay(-0.1); }, "train.weight_decay: must be in [0, 10]"},
      {[](v1::JobSpec& s) { s.mutable_train()->set_lr(std::nan("")); }, "train.lr: must be a finite number"},
      {[](v1::JobSpec& s) { s.mutable_train()->set_lr(INFINITY); }, "train.lr: must be a finite number"},
      {[](v1::JobSpec& s) { s.mutable_train()->mutable_data()->set_digits(20); }, "train.data.digits: must be in [1, 9] (or 0: not given), got 20"},
      {[](v1::JobSpec& s) { s.mutable_groups(0)->mutable_layout()->set_tp(-2); }, "groups[0].layout.tp: must be in [1, 1024]"},
      {[](v1::JobSpec& s) { s.mutable_groups(0)->set_devices(-4); }, "groups[0].devices: must be in [1, 65536]"},
      {[](v1::JobSpec& s) { s.mutable_groups(0)->set_device_type(static_cast<v1::DeviceType>(7)); },
       "groups[0].device_type: unknown value 7 of DeviceType"},
      {[](v1::JobSpec& s) { s.mutable_model()->set_num_layers(1 << 30); }, "model.num_layers: must be in [1, 4096]"},
      {[](v1::JobSpec& s) { s.mutable_model()->set_rope_base(-1); }, "model.rope_base: must be in [2, 1000000000000]"},
      {[](v1::JobSpec& s) { s.mutable_comm_check()->set_iters(-1); }, "comm_check.iters: must be in [1, 100000]"},
      {[](v1::JobSpec& s) { s.mutable_comm_check()->set_warmup(-1); }, "comm_check.warmup: must be in [0, 100000], got -1"},
      {[](v1::JobSpec& s) { s.mutable_comm_check()->add_sizes_bytes(int64_t{1} << 40); }, "comm_check.sizes[0]: must be in"},
      {[](v1::JobSpec& s) { s.mutable_rl()->set_temperature(-1); }, "rl.temperature"},
      {[](v1::JobSpec& s) { s.mutable_generate()->set_top_p(2); }, "generate.top_p: must be in"},
      {[](v1::JobSpec& s) { s.set_name(std::string(5000, 'a')); }, "name: is 5000 bytes long; at most 4096"},
      {[](v1::JobSpec& s) { for (int i = 0; i < 20; ++i) (*s.mutable_env())[absl::StrCat("E", i)] = "1"; }, "env: has 20 entries"},
      {[](v1::JobSpec& s) { for (int i = 0; i < 17; ++i) s.add_groups()->set_name(absl::StrCat("g", i)); }, "groups: has 18 entries"},
      {[](v1::JobSpec& s) { for (int i = 0; i < 5000; ++i) s.mutable_groups(0)->mutable_layout()->add_stage_layers(0); },
       "groups[0].layout.stage_layers: has 5000 entries; at most 4096"},
  };
  for (auto& c : cases) {
    v1::JobSpec s = Parsed();
    c.edit(s);
    EXPECT_THAT(Refusal(s), HasSubstr(c.want));
  }
  v1::JobSpec big = Parsed();
  for (int i = 0; i < 300; ++i) big.mutable_comm_check()->add_collectives("x");
  EXPECT_THAT(Refusal(big), HasSubstr("comm_check.collectives: has 300 entries"));
  // The whole message is bounded before anything in it is looked at.
  v1::JobSpec huge = Parsed();
  for (int i = 0; i < 300; ++i) huge.mutable_comm_check()->add_collectives(std::string(4000, 'x'));
  ASSERT_GT(huge.ByteSizeLong(), kMaxJobSpecBytes);
  EXPECT_THAT(Refusal(huge), HasSubstr("job: the spec is"));
}

// The products of sizes the engine and the scheduler compute, in 64 bits and bounded:
// nothing overflows an int (a crash in the controller), divides by zero, or spins.
TEST(JobSpecLimits, SizeArithmeticIsCheckedNotOverflowed) {
  v1::JobSpec s = Parsed();
  auto* l = s.mutable_groups(0)->mutable_layout();
  l->set_tp(1024), l->set_cp(1024), l->set_dp(65536), l->set_pp(1024);
  EXPECT_THAT(Refusal(s), HasSubstr("the group has 4 devices but tp*cp*dp*pp = 1024*1024*65536*1024 = 70368744177664"));
  s = Parsed();
  s.mutable_groups(0)->mutable_layout()->set_pp(2), s.mutable_groups(0)->mutable_layout()->set_tp(1);
  s.mutable_groups(0)->mutable_layout()->set_vpp(2);
  s.mutable_model()->clear_micro_batch();  // vpp > 1 without micro_batch: divided by zero
  EXPECT_THAT(Refusal(s), HasSubstr("model.micro_batch: is required"));
  s = Parsed();
  s.mutable_model()->set_micro_batch(1 << 20), s.mutable_model()->set_seq_len(1 << 20);
  s.mutable_model()->set_global_batch(1 << 21);
  EXPECT_THAT(Refusal(s), HasSubstr("model.micro_batch: micro_batch x seq_len = 1099511627776 tokens; at most 16777216"));
  s = Parsed();
  s.mutable_groups(0)->set_devices(65536);
  s.mutable_groups(0)->mutable_layout()->set_tp(1), s.mutable_groups(0)->mutable_layout()->set_dp(65536);
  s.mutable_model()->set_micro_batch(1 << 20), s.mutable_model()->set_seq_len(1);
  s.mutable_model()->set_global_batch(1 << 24);  // dp x micro_batch = 2^36: once an int overflow
  EXPECT_THAT(Refusal(s), HasSubstr("is not divisible by dp*micro_batch = 65536*1048576 = 68719476736"));
  s = Parsed();
  s.mutable_groups(0)->mutable_layout()->set_pp(1024), s.mutable_groups(0)->mutable_layout()->set_vpp(1024);
  EXPECT_THAT(Refusal(s), HasSubstr("pp x vpp = 1048576 virtual stages; at most 4096"));
  // `stage_layers: auto` at the largest shape allowed is bounded work.
  s = Parsed();
  s.mutable_groups(0)->set_devices(1024);
  s.mutable_groups(0)->mutable_layout()->set_tp(1), s.mutable_groups(0)->mutable_layout()->set_pp(1024);
  s.mutable_groups(0)->mutable_layout()->set_vpp(4);
  s.mutable_groups(0)->mutable_layout()->set_balance_stages(true);
  s.mutable_model()->set_num_layers(4096), s.mutable_model()->set_global_batch(4096), s.mutable_model()->set_micro_batch(1);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(NormalizeAndValidateJobSpec(s).ok()) << NormalizeAndValidateJobSpec(s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  // RL sample counts.
  v1::JobSpec rl = Parsed();
  rl.set_kind("grpo");
  rl.mutable_rl()->set_prompts_per_step(1000000), rl.mutable_rl()->set_group_size(4096);
  EXPECT_THAT(Refusal(rl), HasSubstr("rl.group_size: prompts_per_step x group_size = 4096000000 samples"));
}

TEST(JobSpecLimits, AJobFileSaysEachThingOnce) {
  EXPECT_THAT(std::string(ParseJobSpecYaml("name: a\nname: b\nkind: comm-check\n").status().message()),
              HasSubstr("name: is given twice"));
  EXPECT_THAT(std::string(ParseJobSpecYaml(std::string(kPretrain) + "train: {steps: 4}\n").status().message()),
              HasSubstr("train: is given twice"));
  EXPECT_THAT(std::string(ParseJobSpecYaml("name: a\nkind: comm-check\ngroups:\n  - {name: w, devices: 2, devices: 4}\n")
                              .status()
                              .message()),
              HasSubstr("groups[0].devices: is given twice"));
  EXPECT_THAT(std::string(ParseJobSpecYaml("name: a\nenv: {OMP_NUM_THREADS: 1, OMP_NUM_THREADS: 2}\n").status().message()),
              HasSubstr("env.OMP_NUM_THREADS: is given twice"));
  // A written 0 where 0 means "not given" is refused rather than read as the default.
  EXPECT_THAT(std::string(ParseJobSpecYaml(kPretrain, {"groups.0.layout.tp=0"}).status().message()),
              HasSubstr("groups[0].layout.tp: must be in [1, 1024]; leave the key out for the default"));
  EXPECT_THAT(std::string(ParseJobSpecYaml(kPretrain, {"collective_timeout_s=0.01"}).status().message()),
              HasSubstr("collective_timeout_s: must be in [0.1, 86400]"));
  EXPECT_THAT(std::string(ParseJobSpecYaml(kPretrain, {"train.lr=inf"}).status().message()), HasSubstr("finite"));
  EXPECT_THAT(std::string(ParseJobSpecYaml(kPretrain, {"model.hidden=99999999999"}).status().message()),
              HasSubstr("model.hidden: must be in [1, 131072]"));
  EXPECT_THAT(std::string(ParseJobSpecYaml(std::string(kMaxJobSpecBytes + 1, '#')).status().message()),
              HasSubstr("at most 1048576"));
}

TEST(JobSpecLimits, RolesAndNamesAreChecked) {
  v1::JobSpec s = Parsed();
  s.mutable_groups(0)->set_role("boss");
  EXPECT_THAT(Refusal(s), HasSubstr("groups[0].role: unknown role 'boss'"));
  s = Parsed();
  s.set_name("-x");
  EXPECT_THAT(Refusal(s), HasSubstr("starting with a letter or digit"));
}

// docs/jobs.md, the reference of every job-file key, cannot drift from the proto and the
// bounds table: every field is there once, by its YAML key and proto field, with the
// type and bounds the validator applies, and says its default, the kinds that read it
// and what it does.
TEST(JobsDoc, EveryKeyIsDocumentedWithItsTypeAndBounds) {
  const std::string path = std::string(TESSERA_SOURCE_DIR) + "/docs/jobs.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  struct Row {
    std::vector<std::string> cells;
    int line;
  };
  std::map<std::string, Row> rows;  // by proto field
  std::string line;
  auto trim = [](std::string c) {
    while (!c.empty() && (c.front() == ' ' || c.front() == '`')) c.erase(c.begin());
    while (!c.empty() && (c.back() == ' ' || c.back() == '`')) c.pop_back();
    return c;
  };
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream ss(line.substr(1));
    for (std::string c; std::getline(ss, c, '|');) cells.push_back(trim(c));
    ASSERT_EQ(cells.size(), 7u) << "docs/jobs.md:" << n << ": a key's row has 7 cells (key, proto, type, default, "
                                << "bounds, kinds, meaning); a '|' inside a cell splits it";
    EXPECT_TRUE(rows.emplace(cells[1], Row{cells, n}).second) << "docs/jobs.md:" << n << ": " << cells[1] << " twice";
  }
  const std::set<std::string> kinds = {"all", "comm-check", "pretrain", "sft", "grpo", "ppo", "generate"};
  for (const JobSpecKey& k : JobSpecKeys()) {
    auto it = rows.find(k.proto);
    const std::string want = "| `" + k.yaml + "` | `" + k.proto + "` | " + k.type + " | ? | " + k.bounds + " | ? | ? |";
    if (it == rows.end()) {
      ADD_FAILURE() << "docs/jobs.md has no row for " << k.proto << ":\n" << want;
      continue;
    }
    const auto& c = it->second.cells;
    const std::string at = "docs/jobs.md:" + std::to_string(it->second.line) + " (" + k.proto + ")";
    EXPECT_EQ(c[0], k.yaml) << at << ": the key";
    EXPECT_EQ(c[2], k.type) << at << ": the type";
    EXPECT_EQ(c[4], k.bounds) << at << ": the bounds";
    EXPECT_FALSE(c[3].empty() || c[3] == "?") << at << ": the default";
    EXPECT_FALSE(c[6].empty() || c[6] == "?") << at << ": the meaning";
    std::stringstream ks(c[5]);
    int n = 0;
    for (std::string kind; std::getline(ks, kind, ',');) {
      EXPECT_TRUE(kinds.count(trim(kind))) << at << ": unknown kind '" << trim(kind) << "'";
      ++n;
    }
    EXPECT_GT(n, 0) << at << ": the kinds";
    rows.erase(it);
  }
  for (const auto& [proto, row] : rows)
    ADD_FAILURE() << "docs/jobs.md:" << row.line << ": " << proto << " is not a JobSpec field";
}

}  // namespace
}  // namespace tessera
