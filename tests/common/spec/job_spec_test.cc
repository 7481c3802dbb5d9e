#include "common/spec/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/spec/job_paths.h"
#include "common/spec/rl_options.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

constexpr char kGood[] = R"(
name: cc
kind: comm-check
max_restarts: 2
groups:
  - name: workers
    devices: 8
    device: cpu
    layout: {tp: 2, pp: 2}
comm_check:
  sizes: [4KiB, 1MiB]
  iters: 3
)";

TEST(JobSpec, ParsesAndDerivesDp) {
  auto spec = ParseJobSpecYaml(kGood);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(NormalizeAndValidateJobSpec(*spec).ok());
  EXPECT_EQ(spec->max_restarts(), 2);
  EXPECT_EQ(spec->groups(0).layout().dp(), 2);
  EXPECT_EQ(spec->groups(0).layout().cp(), 1);
  EXPECT_EQ(spec->groups(0).placement(), v1::PLACEMENT_PACK);
  EXPECT_EQ(spec->comm_check().sizes_bytes(1), 1 << 20);
  EXPECT_EQ(spec->comm_check().collectives_size(), 5);
}

TEST(JobSpec, OverridesApply) {
  auto spec = ParseJobSpecYaml(kGood, {"groups.0.devices=4", "comm_check.sizes=[64]", "max_restarts=0",
                                       "groups.0.layout.pp=1"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->groups(0).devices(), 4);
  EXPECT_EQ(spec->comm_check().sizes_bytes(0), 64);
  EXPECT_EQ(spec->max_restarts(), 0);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(*spec).ok());
  EXPECT_EQ(spec->groups(0).layout().dp(), 2);
}

// A job file with overrides, parsed, normalized and validated: the spec, or the first error.
absl::StatusOr<v1::JobSpec> ValidSpec(const std::string& yaml, const std::vector<std::string>& ov) {
  auto spec = ParseJobSpecYaml(yaml, ov);
  if (!spec.ok()) return spec.status();
  if (absl::Status st = NormalizeAndValidateJobSpec(*spec); !st.ok()) return st;
  return *spec;
}
absl::Status ParseAndValidate(const std::string& yaml, std::vector<std::string> ov = {}) {
  return ValidSpec(yaml, ov).status();
}

TEST(JobSpec, BadInputNamesTheField) {
  struct Case {
    std::vector<std::string> ov;
    std::string want;
  } cases[] = {
      {{"groups.0.layout.tp=two"}, "groups[0].layout.tp: expected an integer, got 'two'"},
      {{"groups.0.colour=red"}, "groups[0].colour: unknown key"},
      {{"bogus=1"}, "bogus: unknown key"},
      {{"groups.0.devices=6", "groups.0.layout.dp=2"}, "groups[0]: layout: the group has 6 devices but tp*cp*dp*pp = 2*1*2*2 = 8"},
      {{"groups.0.device=tpu"}, "groups[0].device: expected cpu or gpu, got 'tpu'"},
      {{"comm_check.sizes=[1XB]"}, "comm_check.sizes[0]: '1XB': unknown unit"},
      {{"comm_check.collectives=[all_to_all]"}, "unknown collective 'all_to_all'"},
      {{"kind=dance"}, "kind: unknown kind 'dance'"},
      {{"name=has space"}, "name: 'has space' must be"},
      {{"max_restarts=-1"}, "max_restarts: must be in [0, 1000], got -1"},
      {{"groups.0.layout.vpp=2", "groups.0.layout.pp=1"}, "requires pp >= 2"},
      {{"groups.0.layout.sp=true", "groups.0.layout.tp=1"}, "sp (sequence parallel) requires tp > 1"},
      {{"groups.0.layout.zero=5"}, "groups[0].layout.zero: must be in [0, 3], got 5"},
      {{"model.num_layers=3"}, "num_layers=3 is not divisible by pp*vpp = 2*1 = 2"},
      {{"groups.0.layout.last_stage_layers=-1"}, "groups[0].layout.last_stage_layers: must be in [0, 4096], got -1"},
      {{"model.num_layers=3", "groups.0.layout.last_stage_layers=3"}, "last_stage_layers=3 leaves 0 of model.num_layers=3"},
      {{"groups.0.layout.stage_layers=[3,x]"}, "groups[0].layout.stage_layers[1]: expected a layer count >= 0, got 'x'"},
      {{"model.num_layers=4", "groups.0.layout.stage_layers=[3,0,1]"},
       "stage_layers has 3 entries; expected one per virtual stage, pp*vpp = 2*1 = 2"},
      {{"model.num_layers=4", "groups.0.layout.stage_layers=3,0"}, "stage_layers [3, 0] sum to 3 layers; model.num_layers=4"},
      {{"model.num_layers=4", "groups.0.layout.stage_layers=3,1", "groups.0.layout.last_stage_layers=1"},
       "set stage_layers or last_stage_layers, not both"},
      {{"model.global_batch=5"}, "global_batch=5 is not divisible by dp*micro_batch = 2*1 = 2"},
      {{"env.LD_PRELOAD=x"}, "env.LD_PRELOAD: not an allowed variable"},
      {{"groups.1.name=x"}, "--set groups.1.name: '1' is not an index of a list of 1"},
  };
  for (const auto& c : cases) {
    auto st = ParseAndValidate(kGood, c.ov);
    EXPECT_FALSE(st.ok()) << c.want;
    EXPECT_THAT(std::string(st.message()), HasSubstr(c.want));
  }
  EXPECT_TRUE(ParseAndValidate(kGood, {"model.num_layers=3", "groups.0.layout.last_stage_layers=1"}).ok());
  // A multi-node job names NCCL's interfaces and HCAs; what would load code stays out.
  EXPECT_TRUE(ParseAndValidate(kGood, {"env.NCCL_SOCKET_IFNAME=ens1f0", "env.NCCL_IB_HCA=mlx5_0,mlx5_1", "env.NCCL_NET=Socket",
                                       "env.NCCL_P2P_DISABLE=1", "env.NCCL_SHM_DISABLE=1"})
                  .ok());
  EXPECT_THAT(std::string(ParseAndValidate(kGood, {"env.NCCL_NET_PLUGIN=/tmp/x.so"}).message()),
              HasSubstr("env.NCCL_NET_PLUGIN: not an allowed variable"));
  EXPECT_TRUE(ParseAndValidate(kGood, {"model.num_layers=3", "groups.0.layout.stage_layers=[3, 0]"}).ok());
  EXPECT_THAT(std::string(ParseAndValidate("name: [unclosed").message()), HasSubstr("not valid YAML"));
  EXPECT_THAT(std::string(ParseAndValidate("- a list").message()), HasSubstr("expected a mapping"));
  EXPECT_EQ(ParseAndValidate(kGood, {"kind=evaluate"}).code(), absl::StatusCode::kUnimplemented);
}

TEST(JobSpec, Colocation) {
  auto spec = ParseJobSpecYaml(kGood);
  ASSERT_TRUE(spec.ok());
  auto* g = spec->add_groups();
  g->set_name("rollout");
  g->set_devices(8);
  g->set_colocate_with("workers");
  EXPECT_TRUE(NormalizeAndValidateJobSpec(*spec).ok());
  g->set_devices(4);
  g->mutable_layout()->set_dp(0);
  auto st = NormalizeAndValidateJobSpec(*spec);
  EXPECT_THAT(std::string(st.message()), HasSubstr("groups[1].colocate_with: group 'rollout' has 4 devices but 'workers' has 8"));
  g->set_devices(8);
  g->mutable_layout()->set_dp(0);
  g->set_colocate_with("nobody");
  EXPECT_THAT(std::string(NormalizeAndValidateJobSpec(*spec).message()), HasSubstr("no group named 'nobody'"));
}

constexpr char kPretrain[] = R"(
name: pt
kind: pretrain
groups:
  - {name: actor, devices: 4, layout: {tp: 2, zero: 1}}
model: {vocab_size: 256, hidden: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, ffn: 64, seq_len: 32,
        global_batch: 8, micro_batch: 2}
train: {steps: 3, lr: 1.0e-3}
)";

// grpo: the pretrain checks plus its own — defaults filled, layouts and data the rollout
// engine and the reward need, the rl section named in every refusal.
TEST(JobSpec, GrpoDefaultsAndRefusals) {
  auto check = [](std::vector<std::string> ov) {
    ov.insert(ov.begin(), "kind=grpo");
    return ValidSpec(kPretrain, ov);
  };
  auto ok = check({});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->rl().group_size(), 8);
  EXPECT_EQ(ok->rl().prompts_per_step(), 16);
  EXPECT_EQ(ok->rl().max_new_tokens(), 6);  // 3 digits + 3
  ASSERT_EQ(ok->rl().stop_size(), 1);
  EXPECT_EQ(ok->rl().stop(0), "\n");  // an arithmetic answer ends its line
  EXPECT_DOUBLE_EQ(ok->rl().clip(), 0.2);
  EXPECT_EQ(ok->rl().eval_every(), 10);
  EXPECT_EQ(ok->rl().eval_problems(), 200);
  EXPECT_THAT(std::string(check({"rl.eval_every=0"}).status().message()), HasSubstr("rl.eval_every"));
  EXPECT_DOUBLE_EQ(ok->rl().reward_timeout_s(), 30.0);
  EXPECT_TRUE(check({"rl.reward_service=127.0.0.1:7000", "rl.reward_timeout_s=2"}).ok());
  EXPECT_THAT(std::string(check({"rl.reward_service=scorer"}).status().message()),
              HasSubstr("rl.reward_service: 'scorer' must be host:port"));
  EXPECT_THAT(std::string(check({"rl.reward_ca_cert=/ca.pem"}).status().message()),
              HasSubstr("rl.reward_ca_cert: needs rl.reward_service"));
  EXPECT_THAT(std::string(check({"train.data.careless=0.5"}).status().message()),
              HasSubstr("train.data.careless: is for sft/pretrain data"));
  EXPECT_THAT(std::string(check({"rl.eval_data=/data/eval.jsonl"}).status().message()),
              HasSubstr("rl.eval_data: held-out JSONL problems are for JSONL prompts"));
  EXPECT_THAT(std::string(check({"train.data.kind=jsonl", "train.data.path=/data/p.jsonl", "rl.eval_data=eval.jsonl"})
                              .status().message()),
              HasSubstr("rl.eval_data"));
  auto held = check({"train.data.kind=jsonl", "train.data.path=/data/p.jsonl", "rl.eval_data=/data/eval.jsonl"});
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->rl().eval_data(), "/data/eval.jsonl");
  EXPECT_TRUE(check({"rl.group_size=4", "rl.kl_coef=0.05", "rl.mini_batches=4"}).ok());
  auto ent = check({"rl.entropy_coef=0.01"});
  ASSERT_TRUE(ent.ok()) << ent.status();
  EXPECT_DOUBLE_EQ(ent->rl().entropy_coef(), 0.01);
  EXPECT_THAT(std::string(check({"rl.entropy_coef=-1"}).status().message()), HasSubstr("rl.entropy_coef"));
  EXPECT_THAT(std::string(check({"rl.group_size=1"}).status().message()), HasSubstr("rl.group_size"));
  EXPECT_THAT(std::string(check({"rl.prompts_per_step=3"}).status().message()),
              HasSubstr("rl.prompts_per_step: 3 prompts do not split over dp=2 ranks"));
  EXPECT_THAT(std::string(check({"rl.mini_batches=100"}).status().message()),
              HasSubstr("rl.mini_batches: 100 mini-batches of 64 samples per DP rank"));
  EXPECT_THAT(std::string(check({"rl.clip=2"}).status().message()), HasSubstr("rl.clip"));
  EXPECT_THAT(std::string(check({"rl.colour=red"}).status().message()), HasSubstr("colour"));
  EXPECT_THAT(std::string(check({"groups.0.layout.pp=2", "groups.0.devices=4", "groups.0.layout.tp=1"}).status().message()),
              HasSubstr("grpo runs generation on the actor's model: no pp, cp or sp yet (pp=2"));
  // JSONL prompts with answers: no stop by default (arithmetic: "\n"), 64 new tokens.
  auto jsonl = check({"train.data.kind=jsonl", "train.data.path=/d.jsonl"});
  ASSERT_TRUE(jsonl.ok()) << jsonl.status();
  EXPECT_EQ(jsonl->rl().stop_size(), 0);
  EXPECT_EQ(jsonl->rl().max_new_tokens(), 64);
  EXPECT_THAT(std::string(check({"rl.stop=ab"}).status().message()), HasSubstr("rl.stop[0]: 'ab' is 2 bytes"));
  EXPECT_THAT(std::string(check({"train.data.kind=jsonl"}).status().message()), HasSubstr("train.data.path"));
  EXPECT_TRUE(check({"train.checkpoint.dir=/ck", "train.checkpoint.save_every=5"}).ok());  // the job's own checkpoints
  EXPECT_THAT(std::string(check({"train.checkpoint.dir=ck"}).status().message()), HasSubstr("train.checkpoint.dir"));
  EXPECT_THAT(std::string(check({"model.tokenizer=/d/tok"}).status().message()),
              HasSubstr("model.tokenizer: is for generate jobs and jsonl data; the built-in grpo data is byte tokens"));
  // A rollout group (split pools, or on the actor's devices with its own layout): tp x dp,
  // the training batch does not have to split over it; refusals name the group.
  {
    auto two = ParseJobSpecYaml(kPretrain, {"kind=grpo", "rl.prompts_per_step=6"});
    ASSERT_TRUE(two.ok());
    auto* g = two->add_groups();
    g->set_name("rollout"), g->set_role("rollout"), g->set_devices(3);  // dp 3: 8 sequences do not split, and need not
    ASSERT_TRUE(NormalizeAndValidateJobSpec(*two).ok()) << NormalizeAndValidateJobSpec(*two);
    EXPECT_NE(RolloutPool(*two), nullptr);
    v1::JobSpec bad = *two;
    bad.mutable_groups(1)->mutable_layout()->set_zero(1);
    EXPECT_THAT(std::string(NormalizeAndValidateJobSpec(bad).message()),
                HasSubstr("groups[1].layout.zero: 1: a rollout group has no optimizer to shard"));

    bad = *two;
    bad.mutable_groups(1)->set_colocate_with("elsewhere");
    EXPECT_THAT(std::string(NormalizeAndValidateJobSpec(bad).message()), HasSubstr("colocate_with"));
    bad = *two;
    bad.mutable_groups(0)->mutable_layout()->set_zero(3);
    EXPECT_THAT(std::string(NormalizeAndValidateJobSpec(bad).message()), HasSubstr("groups[0].layout.zero"));
    bad = *two;
    bad.mutable_rl()->set_prompts_per_step(4);  // 4 prompts over the pool's 3 DP ranks
    EXPECT_THAT(std::string(NormalizeAndValidateJobSpec(bad).message()), HasSubstr("rollout group's dp=3"));
    auto pretrain = ParseJobSpecYaml(kPretrain, {});
    pretrain->add_groups()->CopyFrom(two->groups(1));
    EXPECT_THAT(std::string(NormalizeAndValidateJobSpec(*pretrain).message()), HasSubstr("exactly one worker group"));
  }
  // Reference and critic groups beside the actor: one of each role, each on its own
  // devices or another group's, tp x dp; the refusals name the group's field.
  {
    auto ppo = ParseJobSpecYaml(kPretrain, {"kind=ppo", "rl.prompts_per_step=4", "rl.kl_reward_coef=0.05"});
    ASSERT_TRUE(ppo.ok());
    auto* critic = ppo->add_groups();
    critic->set_name("critic"), critic->set_role("critic"), critic->set_devices(2);
    critic->mutable_layout()->set_zero(1);  // the critic has an optimizer to shard
    auto* ref = ppo->add_groups();
    ref->set_name("ref"), ref->set_role("reference"), ref->set_devices(2), ref->set_colocate_with("critic");
    ASSERT_TRUE(NormalizeAndValidateJobSpec(*ppo).ok()) << NormalizeAndValidateJobSpec(*ppo);
    EXPECT_EQ(GroupWithRole(*ppo, "critic"), &ppo->groups(1));
    EXPECT_EQ(GroupWithRole(*ppo, "reference"), &ppo->groups(2));
    EXPECT_EQ(GroupWithRole(*ppo, "rollout"), nullptr);
    EXPECT_EQ(DevicesOf(*ppo, "ref"), "critic");
    EXPECT_EQ(DevicesOf(*ppo, "critic"), "critic");
    auto refused = [](v1::JobSpec bad) { return std::string(NormalizeAndValidateJobSpec(bad).message()); };
    v1::JobSpec bad = *ppo;
    bad.mutable_groups(2)->set_role("critic");
    EXPECT_THAT(refused(bad), HasSubstr("groups[2].role: a second critic group; a job has one"));
    bad = *ppo;
    bad.mutable_groups(2)->mutable_layout()->set_zero(1);
    EXPECT_THAT(refused(bad), HasSubstr("groups[2].layout.zero: 1: a reference group has no optimizer to shard"));
    bad = *ppo;
    bad.mutable_rl()->set_kl_reward_coef(0);
    EXPECT_THAT(refused(bad), HasSubstr("groups[2].role: a reference group needs a KL term"));
    bad = *ppo;
    bad.mutable_groups(1)->set_role("worker");
    EXPECT_THAT(refused(bad), HasSubstr("groups[1].role: a ppo job's groups after the actor are rollout, reference, critic or reward"));
    bad = *ppo;  // the actor on one DP rank (4 samples), the critic on two (2 each)
    bad.mutable_groups(0)->set_devices(2), bad.mutable_groups(0)->mutable_layout()->set_dp(1);
    bad.mutable_rl()->set_mini_batches(3);
    EXPECT_THAT(refused(bad), HasSubstr("rl.mini_batches: 3 mini-batches of 2 samples per DP rank of the critic group"));
    bad = *ppo;
    bad.set_kind("grpo"), bad.mutable_rl()->clear_kl_reward_coef(), bad.mutable_rl()->set_kl_coef(0.1);
    for (auto clear : {&v1::RlSpec::clear_gamma, &v1::RlSpec::clear_gae_lambda, &v1::RlSpec::clear_value_clip,
                       &v1::RlSpec::clear_critic_lr, &v1::RlSpec::clear_advantage})
      (bad.mutable_rl()->*clear)();  // ppo's defaults
    bad.mutable_rl()->set_group_size(2);
    EXPECT_THAT(refused(bad), HasSubstr("groups[1].role: a critic group is for ppo jobs"));
    bad = *ppo;
    bad.mutable_rl()->set_prompts_per_step(3);
    bad.mutable_groups(0)->set_devices(2), bad.mutable_groups(0)->mutable_layout()->set_dp(1);
    EXPECT_THAT(refused(bad), HasSubstr("rl.prompts_per_step: 3 prompts do not split over the critic group's dp=2 ranks"));
    // offload: groups sharing devices take turns; a group alone on its devices, or a job
    // of another kind, has nothing to make room for.
    v1::JobSpec turns = *ppo;
    turns.mutable_groups(1)->set_offload(true), turns.mutable_groups(2)->set_offload(true);
    EXPECT_TRUE(NormalizeAndValidateJobSpec(turns).ok()) << NormalizeAndValidateJobSpec(turns);
    bad = *ppo;
    bad.mutable_groups(0)->set_offload(true);
    EXPECT_THAT(refused(bad), HasSubstr("groups[0].offload: group 'actor' shares its devices with no other group"));
    auto parsed = ParseJobSpecYaml(kPretrain, {"kind=ppo", "groups.0.offload=true"});
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_TRUE(parsed->groups(0).offload());
    EXPECT_THAT(std::string(ParseJobSpecYaml(kPretrain, {"groups.0.offload=maybe"}).status().message()),
                HasSubstr("groups[0].offload"));
    auto pretrain = ParseJobSpecYaml(kPretrain, {"groups.0.offload=true"});
    ASSERT_TRUE(pretrain.ok());
    EXPECT_THAT(std::string(NormalizeAndValidateJobSpec(*pretrain).message()),
                HasSubstr("groups[0].offload: groups take turns on shared devices in grpo and ppo jobs"));
    // A reward group runs rl.reward_model (a path, exclusive with rl.reward_service).
    v1::JobSpec rm = *ppo;
    auto* reward = rm.add_groups();
    reward->set_name("rm"), reward->set_role("reward"), reward->set_devices(2), reward->set_colocate_with("critic");
    rm.mutable_rl()->set_reward_model("/models/rm");
    ASSERT_TRUE(NormalizeAndValidateJobSpec(rm).ok()) << NormalizeAndValidateJobSpec(rm);
    EXPECT_EQ(GroupWithRole(rm, "reward"), &rm.groups(3));
    EXPECT_THAT(JobPathFields(rm), ::testing::Contains(std::pair<std::string, std::string>("rl.reward_model", "/models/rm")));
    bad = rm;
    bad.mutable_rl()->clear_reward_model();
    EXPECT_THAT(refused(bad), HasSubstr("groups[3].role: a reward group needs rl.reward_model"));
    bad = rm;
    bad.mutable_groups()->RemoveLast();
    EXPECT_THAT(refused(bad), HasSubstr("rl.reward_model: needs a group of role reward"));
    bad = rm;
    bad.mutable_rl()->set_reward_service("localhost:5000");
    EXPECT_THAT(refused(bad), HasSubstr("rl.reward_model: and rl.reward_service both give the reward"));
    bad = rm;
    bad.mutable_rl()->set_reward_model("models/rm");
    EXPECT_THAT(refused(bad), HasSubstr("rl.reward_model"));
    bad = rm;
    bad.mutable_groups(3)->mutable_layout()->set_zero(1);
    EXPECT_THAT(refused(bad), HasSubstr("groups[3].layout.zero: 1: a reward group has no optimizer to shard"));
    auto yaml = ParseJobSpecYaml(kPretrain, {"kind=grpo", "rl.reward_model=rm"});
    ASSERT_TRUE(yaml.ok()) << yaml.status();
    ResolveRelativePaths(*yaml, "/jobs");
    EXPECT_EQ(yaml->rl().reward_model(), "/jobs/rm");
  }
  // On jsonl prompts a tokenizer.json's stop strings are checked by the executors.
  EXPECT_TRUE(check({"train.data.kind=jsonl", "train.data.path=/d.jsonl", "model.tokenizer=/d/tok", "rl.stop=<|im_end|>"}).ok());
  // sft on jsonl takes a tokenizer; on the built-in data it is refused by name.
  EXPECT_TRUE(ValidSpec(kPretrain, {"kind=sft", "train.data.kind=jsonl", "train.data.path=/d.jsonl", "model.tokenizer=/d/tok"}).ok());
  EXPECT_THAT(std::string(ValidSpec(kPretrain, {"model.tokenizer=/d/tok"}).status().message()),
              HasSubstr("model.tokenizer: is for generate jobs and jsonl data"));
  EXPECT_TRUE(ValidSpec(kPretrain, {"model.tokenizer=byte"}).ok());
  auto rl_on_pretrain = ParseJobSpecYaml(kPretrain, {"rl.group_size=4"});
  ASSERT_TRUE(rl_on_pretrain.ok());
  EXPECT_THAT(std::string(NormalizeAndValidateJobSpec(*rl_on_pretrain).message()), HasSubstr("rl: is only for grpo and ppo jobs"));
}

// ppo: grpo's checks with its own defaults (one completion per prompt, GAE's gamma 1 and
// lambda 0.95, value clip 0.2, the critic at train's lr); its fields refused on grpo.
TEST(JobSpec, PpoDefaultsAndRefusals) {
  auto check = [](std::vector<std::string> ov) {
    ov.insert(ov.begin(), "kind=ppo");
    return ValidSpec(kPretrain, ov);
  };
  auto ok = check({});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->rl().group_size(), 1);
  EXPECT_DOUBLE_EQ(ok->rl().gamma(), 1.0);
  EXPECT_DOUBLE_EQ(ok->rl().gae_lambda(), 0.95);
  EXPECT_DOUBLE_EQ(ok->rl().value_clip(), 0.2);
  EXPECT_DOUBLE_EQ(ok->rl().critic_lr(), ok->train().lr());
  auto set = check({"rl.gamma=0.99", "rl.gae_lambda=1", "rl.critic_lr=1e-3", "rl.kl_reward_coef=0.05", "rl.group_size=2"});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_DOUBLE_EQ(set->rl().critic_lr(), 1e-3);
  EXPECT_DOUBLE_EQ(set->rl().kl_reward_coef(), 0.05);
  EXPECT_THAT(std::string(check({"rl.gamma=1.5"}).status().message()), HasSubstr("rl.gamma"));
  EXPECT_TRUE(check({"train.checkpoint.dir=/ck"}).ok());  // the actor's, and the critic's under /ck/critic
  EXPECT_THAT(std::string(check({"groups.0.layout.sp=true", "groups.0.layout.tp=2", "groups.0.devices=4"}).status().message()),
              HasSubstr("ppo runs generation on the actor's model"));
  auto grpo = ValidSpec(kPretrain, {"kind=grpo", "rl.gamma=0.9"});
  EXPECT_THAT(std::string(grpo.status().message()), HasSubstr("rl.gamma: discounts ppo's and reinforce_plus_plus's returns"));
  EXPECT_THAT(std::string(ValidSpec(kPretrain, {"kind=grpo", "rl.group_size=1"}).status().message()),
              HasSubstr("grpo needs >= 2 completions per prompt"));
}

// The algorithm's knobs (docs/jobs.md, rl.*): defaults written into the spec, every
// name read as common/spec/rl_options.h reads it, and each misuse refused by its field.
TEST(JobSpec, RlAlgorithmKnobs) {
  auto grpo = [](std::vector<std::string> ov) {
    ov.insert(ov.begin(), "kind=grpo");
    return ValidSpec(kPretrain, ov);
  };
  auto ok = grpo({});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->rl().advantage(), "grpo");
  auto loss = PolicyLossOf(ok->rl());
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(loss->clip_low, 0.2);
  EXPECT_EQ(loss->clip_high, 0.2);
  EXPECT_EQ(loss->dual_clip, 3.0);
  EXPECT_EQ(loss->kl, rl::KlEstimator::kK3);
  EXPECT_EQ(loss->aggregation, rl::LossAggregation::kTokenMean);
  EXPECT_EQ(OverlongOf(ok->rl()).factor, 0);
  auto adv = OutcomeAdvantagesOf(ok->rl());
  ASSERT_TRUE(adv.ok());
  EXPECT_EQ(adv->estimator, rl::AdvantageEstimator::kGrpo);
  EXPECT_TRUE(adv->scale_by_std);
  EXPECT_EQ(ValidSpec(kPretrain, {"kind=ppo"})->rl().advantage(), "gae");

  auto set = grpo({"rl.advantage=reinforce_plus_plus", "rl.gamma=0.99", "rl.kl_coef=0.01", "rl.kl_estimator=low_var_kl",
                   "rl.kl_reward_coef=0.05", "rl.kl_reward_estimator=k2", "rl.clip_low=0.2", "rl.clip_high=0.28",
                   "rl.dual_clip=0", "rl.loss_agg=seq-mean-token-sum-norm", "rl.overlong_buffer=2", "rl.max_new_tokens=6",
                   "rl.overlong_penalty=0.5"});
  ASSERT_TRUE(set.ok()) << set.status();
  loss = PolicyLossOf(set->rl());
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(loss->clip_high, 0.28);
  EXPECT_EQ(loss->dual_clip, 0);
  EXPECT_EQ(loss->kl, rl::KlEstimator::kLowVarK3);
  EXPECT_EQ(loss->aggregation, rl::LossAggregation::kSeqMeanTokenSumNorm);
  EXPECT_EQ(loss->norm_length, 6);
  adv = OutcomeAdvantagesOf(set->rl());
  ASSERT_TRUE(adv.ok());
  EXPECT_EQ(adv->estimator, rl::AdvantageEstimator::kReinforcePlusPlus);
  EXPECT_EQ(adv->gamma, 0.99);
  EXPECT_EQ(adv->kl_reward, rl::KlEstimator::kK2);
  EXPECT_EQ(adv->kl_reward_coef, 0.05);
  const rl::OverlongOptions overlong = OverlongOf(set->rl());
  EXPECT_EQ(overlong.max_length, 6);
  EXPECT_EQ(overlong.buffer, 2);
  EXPECT_EQ(overlong.factor, 0.5);
  EXPECT_EQ(OverlongOf(grpo({"rl.overlong_buffer=2", "rl.max_new_tokens=6"})->rl()).factor, 1.0);
  auto dr = grpo({"rl.norm_adv_by_std=false"});
  ASSERT_TRUE(dr.ok()) << dr.status();
  EXPECT_FALSE(OutcomeAdvantagesOf(dr->rl())->scale_by_std);
  auto from_yaml = ParseJobSpecYaml(absl::StrCat(kPretrain, "rl: {advantage: rloo, loss_agg: seq_mean_token_mean, dual_clip: 2.5}\n"),
                                    {"kind=grpo"});
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status();
  EXPECT_EQ(from_yaml->rl().advantage(), "rloo");
  EXPECT_EQ(from_yaml->rl().dual_clip(), 2.5);

  auto refused = [&](std::vector<std::string> ov) { return std::string(grpo(ov).status().message()); };
  EXPECT_THAT(refused({"rl.advantage=gae"}), HasSubstr("rl.advantage: gae needs a critic's values: kind ppo"));
  EXPECT_THAT(refused({"rl.advantage=ppo"}), HasSubstr("rl.advantage: 'ppo': expected grpo, rloo, reinforce_plus_plus or gae"));
  EXPECT_THAT(std::string(ValidSpec(kPretrain, {"kind=ppo", "rl.advantage=rloo"}).status().message()),
              HasSubstr("rl.advantage: 'rloo' on a ppo job: its critic gives GAE advantages"));
  EXPECT_THAT(refused({"rl.advantage=rloo", "rl.norm_adv_by_std=false"}),
              HasSubstr("rl.norm_adv_by_std: is for rl.advantage grpo (this job's is rloo)"));
  EXPECT_THAT(refused({"rl.kl_estimator=k2"}), HasSubstr("rl.kl_estimator: has no effect without rl.kl_coef > 0"));
  EXPECT_THAT(refused({"rl.kl_reward_estimator=k3"}), HasSubstr("rl.kl_reward_estimator: has no effect without rl.kl_reward_coef > 0"));
  EXPECT_THAT(refused({"rl.kl_coef=0.1", "rl.kl_estimator=k5"}), HasSubstr("rl.kl_estimator: 'k5': expected k1, k2, k3 or low_var_kl"));
  EXPECT_THAT(refused({"rl.loss_agg=mean"}), HasSubstr("rl.loss_agg: 'mean': expected token_mean"));
  EXPECT_THAT(refused({"rl.dual_clip=0.5"}), HasSubstr("rl.dual_clip: 0.5: expected > 1"));
  EXPECT_THAT(refused({"rl.clip_low=1"}), HasSubstr("rl.clip_low"));
  EXPECT_THAT(refused({"rl.overlong_penalty=0.5"}), HasSubstr("rl.overlong_penalty: needs rl.overlong_buffer"));
  EXPECT_THAT(refused({"rl.overlong_buffer=6", "rl.max_new_tokens=6"}),
              HasSubstr("rl.overlong_buffer: 6 tokens: expected fewer than rl.max_new_tokens (6)"));
  EXPECT_THAT(refused({"train.data.shuffle=true"}), HasSubstr("train.data.shuffle: is for JSONL prompts"));
  EXPECT_EQ(PolicyLossOf(grpo({"rl.tis_cap=2"})->rl())->tis_cap, 2);
  EXPECT_THAT(refused({"rl.tis_cap=2", "rl.temperature=0.7"}), HasSubstr("rl.tis_cap: compares the rollout's log-probs"));
  EXPECT_THAT(refused({"rl.max_staleness=2"}), HasSubstr("rl.max_staleness"));
  EXPECT_THAT(refused({"rl.max_staleness=1"}), HasSubstr("it needs a rollout group on devices of its own"));
  auto dynamic = grpo({"rl.filter_groups=true"});
  ASSERT_TRUE(dynamic.ok()) << dynamic.status();
  EXPECT_EQ(dynamic->rl().max_gen_batches(), 4);
  EXPECT_THAT(refused({"rl.max_gen_batches=3"}), HasSubstr("rl.max_gen_batches: bounds dynamic sampling's generations"));
  EXPECT_THAT(refused({"rl.filter_groups=true", "rl.max_gen_batches=101"}), HasSubstr("rl.max_gen_batches"));
  EXPECT_THAT(std::string(ValidSpec(kPretrain, {"kind=ppo", "rl.filter_groups=true"}).status().message()),
              HasSubstr("rl.filter_groups: is for grpo jobs"));
  EXPECT_THAT(std::string(ValidSpec(kPretrain, {"train.data.shuffle=true"}).status().message()),
              HasSubstr("train.data.shuffle: is for grpo and ppo prompts, not pretrain data"));
}

// Multi-turn rollouts (rl.environment, tool_stop, max_turns): the defaults, the three
// together, and each alone refused by its field; the calculator's SFT data only for sft.
TEST(JobSpec, MultiTurnSettings) {
  auto grpo = [](std::vector<std::string> ov) {
    ov.insert(ov.begin(), "kind=grpo");
    return ValidSpec(kPretrain, ov);
  };
  auto plain = grpo({});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->rl().max_turns(), 1);
  EXPECT_EQ(plain->rl().environment_timeout_s(), 30);
  auto tools = grpo({"rl.environment=127.0.0.1:50061", "rl.tool_stop=)", "rl.max_turns=3", "rl.environment_timeout_s=2"});
  ASSERT_TRUE(tools.ok()) << tools.status();
  EXPECT_EQ(tools->rl().tool_stop(), ")");
  EXPECT_EQ(tools->rl().max_turns(), 3);
  auto refused = [&](std::vector<std::string> ov) { return std::string(grpo(ov).status().message()); };
  EXPECT_THAT(refused({"rl.tool_stop=)"}), HasSubstr("rl.tool_stop: is for multi-turn rollouts: it needs rl.environment"));
  EXPECT_THAT(refused({"rl.max_turns=2"}), HasSubstr("rl.max_turns: is for multi-turn rollouts"));
  EXPECT_THAT(refused({"rl.environment=127.0.0.1:50061", "rl.max_turns=2"}), HasSubstr("rl.tool_stop: is required with rl.environment"));
  EXPECT_THAT(refused({"rl.environment=127.0.0.1:50061", "rl.tool_stop=)"}), HasSubstr("rl.max_turns: is 1 (single-turn)"));
  EXPECT_THAT(refused({"rl.environment=calculator", "rl.tool_stop=)", "rl.max_turns=2"}),
              HasSubstr("rl.environment: 'calculator' must be host:port"));
  EXPECT_THAT(refused({"rl.environment=127.0.0.1:1", "rl.tool_stop=)", "rl.max_turns=65"}), HasSubstr("rl.max_turns"));
  EXPECT_THAT(refused({"train.data.calculator=0.5"}), HasSubstr("train.data.calculator: is for sft/pretrain data"));
  auto sft = ValidSpec(kPretrain, {"kind=sft", "train.data.calculator=0.25"});
  ASSERT_TRUE(sft.ok()) << sft.status();
  EXPECT_EQ(sft->train().data().calculator(), 0.25);
}

TEST(JobSpec, GenerateDefaultsAndRefusals) {
  const std::string base =
      "name: g\nkind: generate\ngroups:\n  - name: rollout\n    devices: 2\n"
      "model: {vocab_size: 256, hidden: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, ffn: 48}\n"
      "generate: {input: /d/in.jsonl, output: /d/out.jsonl, checkpoint: /d/ckpt, stop: [\"\\n\"]}\n";
  auto check = [&](std::vector<std::string> ov) { return ValidSpec(base, ov); };
  auto ok = check({});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->groups(0).layout().dp(), 2);
  EXPECT_EQ(ok->generate().max_new_tokens(), 64);
  EXPECT_DOUBLE_EQ(ok->generate().temperature(), 1.0);
  EXPECT_DOUBLE_EQ(ok->generate().top_p(), 1.0);
  EXPECT_EQ(ok->generate().n(), 1);
  ASSERT_EQ(ok->generate().stop_size(), 1);
  EXPECT_EQ(ok->generate().stop(0), "\n");
  auto greedy = check({"generate.temperature=0"});
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  EXPECT_DOUBLE_EQ(greedy->generate().temperature(), 0.0);  // set, not the default
  auto msg = [&](std::vector<std::string> ov) { return std::string(check(ov).status().message()); };
  auto without = [&](void (v1::GenerateSpec::*clear)()) {
    auto s = ParseJobSpecYaml(base);
    ((*s->mutable_generate()).*clear)();
    return std::string(NormalizeAndValidateJobSpec(*s).message());
  };
  EXPECT_THAT(without(&v1::GenerateSpec::clear_input), HasSubstr("generate.input: is required"));
  EXPECT_THAT(without(&v1::GenerateSpec::clear_checkpoint), HasSubstr("generate.checkpoint: is required without model.hf_dir"));
  EXPECT_THAT(msg({"generate.output=out.jsonl"}), HasSubstr("generate.output: must be an absolute path"));
  EXPECT_THAT(msg({"generate.output=/d/in.jsonl"}), HasSubstr("generate.output: must not be the input file"));
  EXPECT_THAT(msg({"generate.stop=ab"}), HasSubstr("generate.stop[0]: 'ab' is 2 bytes"));
  // With a tokenizer.json a stop string is one token of it: the executor checks.
  auto tok = check({"generate.stop=<|eot_id|>", "model.tokenizer=/d/tok"});
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->model().tokenizer(), "/d/tok");
  EXPECT_THAT(msg({"model.tokenizer=tok.json"}), HasSubstr("model.tokenizer: must be an absolute path"));
  EXPECT_THAT(msg({"generate.stop=ab", "model.tokenizer=byte"}), HasSubstr("generate.stop[0]: 'ab' is 2 bytes"));
  EXPECT_THAT(msg({"generate.top_p=0"}), HasSubstr("generate.top_p"));
  EXPECT_THAT(msg({"generate.colour=red"}), HasSubstr("colour"));
  EXPECT_THAT(msg({"groups.0.layout.pp=2"}), HasSubstr("generate runs tp x dp"));
  auto no_ffn = ParseJobSpecYaml(base);
  no_ffn->mutable_model()->clear_ffn();
  EXPECT_THAT(std::string(NormalizeAndValidateJobSpec(*no_ffn).message()), HasSubstr("model.ffn: is required for generate jobs"));
  auto gen_on_sft = ParseJobSpecYaml(kPretrain, {"generate.n=2"});
  ASSERT_TRUE(gen_on_sft.ok());
  EXPECT_THAT(std::string(NormalizeAndValidateJobSpec(*gen_on_sft).message()), HasSubstr("generate: is only for generate jobs"));
  EXPECT_THAT(std::string(CheckJobPaths(*ok, {"/elsewhere"}).message()), HasSubstr("generate.input"));
  EXPECT_TRUE(CheckJobPaths(*ok, {"/d"}).ok());
}

TEST(JobSpec, PretrainDefaultsAndRefusals) {
  auto spec = ParseJobSpecYaml(kPretrain);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(NormalizeAndValidateJobSpec(*spec).ok());
  EXPECT_EQ(spec->groups(0).layout().dp(), 2);
  EXPECT_EQ(spec->train().data().kind(), "arithmetic");
  EXPECT_EQ(spec->train().data().digits(), 3);
  EXPECT_DOUBLE_EQ(spec->train().clip_norm(), 1.0);
  auto check = [](std::vector<std::string> ov) {
    auto s = ParseJobSpecYaml(kPretrain, ov);
    if (!s.ok()) return s.status();
    return NormalizeAndValidateJobSpec(*s);
  };
  auto no_ffn = ParseJobSpecYaml(kPretrain);
  no_ffn->mutable_model()->clear_ffn();
  EXPECT_THAT(std::string(NormalizeAndValidateJobSpec(*no_ffn).message()), HasSubstr("model.ffn: is required"));
  EXPECT_THAT(std::string(check({"model.vocab_size=100"}).message()), HasSubstr("must be >= 256"));
  auto no_lr = ParseJobSpecYaml(kPretrain);
  no_lr->mutable_train()->clear_lr();
  EXPECT_THAT(std::string(NormalizeAndValidateJobSpec(*no_lr).message()), HasSubstr("train.lr: is required"));
  EXPECT_THAT(std::string(check({"train.data.kind=csv"}).message()), HasSubstr("expected arithmetic or jsonl"));
  EXPECT_THAT(std::string(check({"train.data.kind=jsonl"}).message()), HasSubstr("train.data.path: is required"));
  EXPECT_THAT(std::string(check({"train.data.kind=jsonl", "train.data.path=d.jsonl"}).message()),
              HasSubstr("train.data.path: must be an absolute path"));
  EXPECT_TRUE(check({"train.data.kind=jsonl", "train.data.path=/data/d.jsonl"}).ok());
  EXPECT_TRUE(check({"train.data.careless=0.6"}).ok());
  EXPECT_THAT(std::string(check({"train.data.careless=1.5"}).message()), HasSubstr("train.data.careless"));
  EXPECT_THAT(std::string(check({"train.data.kind=jsonl", "train.data.path=/data/d.jsonl", "train.data.careless=0.5"}).message()),
              HasSubstr("train.data.careless: is only for the built-in arithmetic data"));
  EXPECT_THAT(std::string(check({"train.colour=red"}).message()), HasSubstr("colour"));
  EXPECT_TRUE(check({"groups.0.layout.pp=2", "groups.0.devices=4", "groups.0.layout.tp=1"}).ok());
  EXPECT_TRUE(check({"groups.0.layout.pp=2", "groups.0.devices=4", "groups.0.layout.tp=1", "groups.0.layout.zero=3"}).ok());
  EXPECT_THAT(std::string(check({"groups.0.layout.pp=2", "groups.0.layout.vpp=2", "groups.0.devices=4",
                                 "groups.0.layout.tp=1", "model.num_layers=4", "model.global_batch=12"})
                              .message()),
              HasSubstr("multiple of pp"));
  EXPECT_TRUE(check({"groups.0.layout.pp=2", "groups.0.layout.vpp=2", "groups.0.devices=4", "groups.0.layout.tp=1",
                     "model.num_layers=4", "train.schedule=gpipe"})
                  .ok());
  EXPECT_THAT(std::string(check({"train.schedule=zigzag"}).message()), HasSubstr("train.schedule: expected 1f1b or gpipe"));
  EXPECT_TRUE(check({"train.precision=bf16"}).ok());
  EXPECT_THAT(std::string(check({"train.precision=fp8"}).message()),
              HasSubstr("train.precision: expected auto, bf16 or f32, got 'fp8'"));
  EXPECT_TRUE(check({"groups.0.layout.pp=2", "groups.0.devices=4", "groups.0.layout.tp=1", "groups.0.device=gpu"}).ok());
  EXPECT_TRUE(check({"groups.0.layout.zero=3"}).ok());
  EXPECT_TRUE(check({"groups.0.layout.cp=2", "groups.0.layout.dp=1"}).ok());
  EXPECT_TRUE(check({"groups.0.layout.sp=true"}).ok());
  EXPECT_TRUE(check({"kind=sft"}).ok());
}

TEST(JobSpec, CheckpointPathsAreAbsoluteAndUnderTheRoots) {
  auto parse = [](std::vector<std::string> sets) { return ParseJobSpecYaml(kPretrain, sets); };
  auto spec = parse({"train.checkpoint={dir: /data/ckpt/run1, save_every: 10}"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(NormalizeAndValidateJobSpec(*spec).ok());
  EXPECT_EQ(spec->train().checkpoint().save_every(), 10);
  EXPECT_TRUE(spec->train().checkpoint().resume());  // the default
  EXPECT_TRUE(CheckJobPaths(*spec, {"/data"}).ok());
  EXPECT_TRUE(CheckJobPaths(*spec, {"/scratch", "/data/"}).ok());
  auto denied = CheckJobPaths(*spec, {"/dat"});  // a prefix of a component is not the directory
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(denied.message()), HasSubstr("train.checkpoint.dir: '/data/ckpt/run1' is outside"));
  EXPECT_THAT(std::string(CheckJobPaths(*spec, {}).message()), HasSubstr("start it with --path-root"));
  auto check = [&](std::vector<std::string> sets) {
    auto s = parse(sets);
    return s.ok() ? NormalizeAndValidateJobSpec(*s) : s.status();
  };
  EXPECT_THAT(std::string(check({"train.checkpoint.dir=ckpt"}).message()),
              HasSubstr("train.checkpoint.dir: must be an absolute path, got 'ckpt'"));
  EXPECT_THAT(std::string(check({"train.checkpoint.load=/data/../etc"}).message()),
              HasSubstr("train.checkpoint.load: must not contain '.' or '..'"));
  EXPECT_THAT(std::string(check({"train.checkpoint.save_every=5"}).message()),
              HasSubstr("train.checkpoint.save_every: needs train.checkpoint.dir"));
  EXPECT_THAT(std::string(check({"train.checkpoint.every=5"}).message()), HasSubstr("every"));
  EXPECT_THAT(std::string(check({"train.checkpoint.resume=maybe"}).message()), HasSubstr("train.checkpoint.resume"));
  // A Hugging Face start: the dims come from its config.json; paths are checked too.
  EXPECT_THAT(std::string(check({"model.hf_dir=/models/llama"}).message()),
              HasSubstr("model.hidden: comes from model.hf_dir's config.json; leave it out"));
  auto hf = parse({"model={hf_dir: /models/llama, seq_len: 32, global_batch: 8, micro_batch: 2}",
                   "train.export_hf=/out/model", "train.recompute=true", "train.recompute_swiglu=true"});
  ASSERT_TRUE(hf.ok()) << hf.status();
  ASSERT_TRUE(NormalizeAndValidateJobSpec(*hf).ok());
  EXPECT_TRUE(hf->train().recompute());
  EXPECT_TRUE(hf->train().recompute_swiglu());
  EXPECT_THAT(std::string(check({"train.recompute_swiglu=maybe"}).message()), HasSubstr("train.recompute_swiglu"));
  EXPECT_THAT(std::string(CheckJobPaths(*hf, {"/models"}).message()), HasSubstr("train.export_hf: '/out/model'"));
  EXPECT_TRUE(CheckJobPaths(*hf, {"/models", "/out"}).ok());
  EXPECT_THAT(std::string(check({"train.export_hf=out"}).message()), HasSubstr("train.export_hf: must be an absolute path"));
  auto no_resume = parse({"train.checkpoint={dir: /d, resume: false}"});
  ASSERT_TRUE(no_resume.ok());
  ASSERT_TRUE(NormalizeAndValidateJobSpec(*no_resume).ok());
  EXPECT_FALSE(no_resume->train().checkpoint().resume());
}

// `stage_layers: auto` becomes the split that balances the ranks' FLOPs (as `tessera plan`
// suggests), written into the layout; what it needs is refused by field.
TEST(JobSpec, StageLayersAutoIsTheBalancedSplit) {
  constexpr char k1b[] = R"(
name: pp
kind: pretrain
groups:
  - name: actor
    devices: 4
    device: gpu
    layout: {pp: 4, vpp: 2, stage_layers: auto}
model: {vocab_size: 128256, hidden: 2048, num_layers: 16, num_heads: 32, num_kv_heads: 8, ffn: 8192, seq_len: 4096,
        global_batch: 8, micro_batch: 1}
train: {steps: 1, lr: 1.0e-4}
)";
  auto layers = [](const v1::JobSpec& s) {
    const auto& l = s.groups(0).layout();
    EXPECT_FALSE(l.balance_stages());
    return std::vector<int>(l.stage_layers().begin(), l.stage_layers().end());
  };
  auto vpp2 = ValidSpec(k1b, {});
  ASSERT_TRUE(vpp2.ok()) << vpp2.status();
  EXPECT_THAT(layers(*vpp2), ::testing::ElementsAre(3, 3, 3, 1, 2, 2, 2, 0));
  auto vpp1 = ValidSpec(k1b, {"groups.0.layout.vpp=1"});
  ASSERT_TRUE(vpp1.ok()) << vpp1.status();
  EXPECT_THAT(layers(*vpp1), ::testing::ElementsAre(5, 5, 5, 1));
  auto again = *vpp1;  // validating the resolved spec again (the controller does) keeps it
  ASSERT_TRUE(NormalizeAndValidateJobSpec(again).ok());
  EXPECT_THAT(layers(again), ::testing::ElementsAre(5, 5, 5, 1));
  auto listed = ValidSpec(k1b, {"groups.0.layout.vpp=1", "groups.0.layout.stage_layers=4,4,4,4"});  // --set overrides auto
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_THAT(layers(*listed), ::testing::ElementsAre(4, 4, 4, 4));
  EXPECT_THAT(std::string(ParseAndValidate(k1b, {"groups.0.layout.pp=1", "groups.0.layout.vpp=1",
                                                 "groups.0.layout.dp=4"}).message()),
              HasSubstr("groups[0].layout.stage_layers: auto balances a pipeline's stages; it needs pp >= 2, got pp = 1"));
  EXPECT_THAT(std::string(ParseAndValidate(k1b, {"groups.0.layout.last_stage_layers=1"}).message()),
              HasSubstr("auto and last_stage_layers both set the split"));
  EXPECT_THAT(std::string(ParseAndValidate(kGood, {"groups.0.layout.stage_layers=auto"}).message()),
              HasSubstr("groups[0].layout.stage_layers: auto needs the model's shape in the job (model.num_layers"));
}

TEST(JobSpec, CheckpointKeep) {
  constexpr char kPretrain[] = R"(
name: pt
kind: pretrain
groups: [{name: actor, devices: 1}]
model: {vocab_size: 256, hidden: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, ffn: 48, seq_len: 16,
        global_batch: 2, micro_batch: 1}
train: {steps: 4, lr: 1.0e-3, checkpoint: {dir: /tmp/ck, save_every: 1, keep: 2}}
)";
  auto spec = ValidSpec(kPretrain, {});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->train().checkpoint().keep(), 2);
  EXPECT_THAT(std::string(ParseAndValidate(kPretrain, {"train.checkpoint.keep=-1"}).message()),
              HasSubstr("train.checkpoint.keep: must be in [0, 1000000], got -1"));
  EXPECT_THAT(std::string(ParseAndValidate(kPretrain, {"train.checkpoint={keep: 3}"}).message()),
              HasSubstr("train.checkpoint.keep: needs train.checkpoint.dir"));
}

// Every job file under examples/ (what the README and docs tell users to run) parses and
// passes the checks that need no cluster, its relative paths taken from the repository
// root as `tessera local` run there takes them: an example broken by a change to the
// spec fails here, not in a user's hands.
TEST(JobSpec, EveryExampleParsesAndValidates) {
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(TESSERA_SOURCE_DIR) + "/examples")) {
    if (e.path().extension() != ".yaml") continue;
    std::ifstream in(e.path());
    std::stringstream text;
    text << in.rdbuf();
    auto spec = ParseJobSpecYaml(text.str());
    ASSERT_TRUE(spec.ok()) << e.path() << ": " << spec.status();
    ResolveRelativePaths(*spec, TESSERA_SOURCE_DIR);
    EXPECT_TRUE(NormalizeAndValidateJobSpec(*spec).ok()) << e.path() << ": " << NormalizeAndValidateJobSpec(*spec);
    ++files;
  }
  EXPECT_GE(files, 19);
}

}  // namespace
}  // namespace tessera
