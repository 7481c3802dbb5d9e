// The memory plan of RL jobs (common/plan/rl_plan.h): each model on the device set of its
// group, its states as the training plan or a frozen compute copy counts them, and the KV
// cache of the generating group by hand.
#include "common/plan/rl_plan.h"

#include <algorithm>
#include <map>

#include "common/plan/plan.h"
#include "common/plan/plan_spec.h"
#include "common/spec/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::plan {
namespace {

constexpr char kPpo[] = R"(name: ppo
kind: ppo
groups:
  - {name: actor, devices: 2, device: gpu, layout: {dp: 2}}
  - {name: critic, role: critic, devices: 2, device: gpu, layout: {dp: 2, zero: 1}}
  - {name: ref, role: reference, devices: 2, device: gpu, colocate_with: critic, layout: {tp: 2}}
model: {vocab_size: 1024, hidden: 256, num_layers: 4, num_heads: 8, num_kv_heads: 4, ffn: 512, seq_len: 64,
        global_batch: 8, micro_batch: 2}
train: {steps: 2, lr: 1.0e-5, data: {kind: arithmetic, digits: 2}}
rl: {prompts_per_step: 8, group_size: 2, max_new_tokens: 100, kl_reward_coef: 0.1, max_tokens_per_micro_batch: 512}
)";

v1::JobSpec Spec(const char* yaml, const std::vector<std::string>& overrides = {}) {
  auto s = ParseJobSpecYaml(yaml, overrides);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return {};
  const absl::Status valid = NormalizeAndValidateJobSpec(*s);
  EXPECT_TRUE(valid.ok()) << valid;
  return *s;
}

TEST(RlPlan, EachModelOnItsGroupsDevicesWithTheKvCacheByHand) {
  const v1::JobSpec spec = Spec(kPpo);
  auto plan = PlanRl(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->models.size(), 3u);
  EXPECT_EQ(plan->models[0].model, "actor");
  EXPECT_EQ(plan->models[1].model, "reference");
  EXPECT_EQ(plan->models[1].device_set, "critic");
  EXPECT_EQ(plan->models[2].model, "critic");
  ASSERT_EQ(plan->devices.size(), 2u);
  // The actor: its training plan at micro-batches of 512 tokens.
  PlanInput in = PlanInputOf(spec);
  in.micro_batch = 1, in.seq_len = 512, in.global_batch = 2;
  auto actor = PlanTraining(in);
  ASSERT_TRUE(actor.ok());
  EXPECT_EQ(plan->models[0].states, actor->memory.states());
  EXPECT_EQ(plan->models[0].pass, actor->memory.activations);
  // The reference at tp 2: its half of the parameters, bf16 only.
  const int64_t params = in.config.NumParams();
  EXPECT_NEAR(double(plan->models[1].states), 2.0 * params / 2, 0.1 * params);
  // The critic under ZeRO-1 keeps less than the actor's replicated states.
  EXPECT_LT(plan->models[2].states, plan->models[0].states);
  EXPECT_EQ(plan->devices[1].states, plan->models[1].states + plan->models[2].states);
  // KV: 2 (k, v) x 4 layers x 4 heads x 32 dims x 2 bytes per token, each sample at its
  // longest ("12+34=": 6 prompt tokens + 100), the DP rank's 4 prompts x 2 samples.
  const int64_t per_token = 2 * 4 * 4 * 32 * 2;
  EXPECT_EQ(plan->devices[0].kv_sequence, per_token * 106);
  EXPECT_EQ(plan->devices[0].kv_cache, per_token * 106 * 8);
  EXPECT_EQ(plan->devices[1].kv_cache, 0);
  EXPECT_THAT(DeviceSetModels(*plan, plan->devices[1]), ::testing::HasSubstr("reference ('ref')"));
}

// One group: the reference and the critic beside the actor, on its devices; a reward
// group counts its own model's shape; a split rollout pool holds the KV cache.
TEST(RlPlan, OneGroupHoldsEveryModelAndARolloutPoolTheCache) {
  v1::JobSpec one = Spec(kPpo);
  while (one.groups_size() > 1) one.mutable_groups()->RemoveLast();
  auto plan = PlanRl(one);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->devices.size(), 1u);
  ASSERT_EQ(plan->models.size(), 3u);
  int64_t sum = 0, largest = 0;
  for (const RlGroupMemory& m : plan->models) sum += m.states, largest = std::max(largest, m.pass);
  EXPECT_EQ(plan->devices[0].need(), sum + largest);

  v1::JobSpec split = Spec(kPpo);
  auto* pool = split.add_groups();
  pool->set_name("gen"), pool->set_role("rollout"), pool->set_devices(2);
  pool->set_device_type(v1::DEVICE_TYPE_GPU);
  pool->mutable_layout()->set_tp(2);
  model::LlamaConfig rm;
  rm.vocab = 1024, rm.hidden = 128, rm.layers = 2, rm.heads = 4, rm.kv_heads = 4, rm.ffn = 256;
  rm.value_head = rm.sequence_score = true;
  split.mutable_rl()->set_reward_model("/models/rm");
  auto* reward = split.add_groups();
  reward->set_name("rm"), reward->set_role("reward"), reward->set_devices(2), reward->set_colocate_with("gen");
  reward->set_device_type(v1::DEVICE_TYPE_GPU);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(split).ok()) << NormalizeAndValidateJobSpec(split);
  plan = PlanRl(split, nullptr, &rm);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->devices.size(), 3u);
  EXPECT_EQ(plan->devices[0].kv_cache, 0);
  EXPECT_EQ(plan->devices[2].name, "gen");
  EXPECT_EQ(plan->devices[2].kv_sequence, 2 * 4 * (4 / 2) * 32 * 2 * 106);  // tp 2: half the KV heads
  EXPECT_THAT(DeviceSetModels(*plan, plan->devices[2]), ::testing::HasSubstr("reward ('rm')"));
  EXPECT_NEAR(double(plan->models.back().states), 2.0 * rm.NumParams(), 0.05 * rm.NumParams());
}

// Groups that take turns (groups[].offload): what stays is the non-offloading groups'
// states; a device needs, over the turns, what stays plus the running group's states
// and pass — the actor's and a colocated rollout group's both for the weight sync; a
// group that stays runs beside the largest offloading group — and the cache's group
// keeps its states beside the cache.
TEST(RlPlan, OffloadingGroupsCountOnlyTheirTurn) {
  v1::JobSpec spec = Spec(kPpo, {"groups.1.colocate_with=actor", "groups.2.colocate_with=actor"});
  auto* pool = spec.add_groups();
  pool->set_name("gen"), pool->set_role("rollout"), pool->set_devices(2), pool->set_colocate_with("actor");
  pool->set_device_type(v1::DEVICE_TYPE_GPU);
  pool->mutable_layout()->set_tp(2);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  auto kept = PlanRl(spec);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_EQ(kept->devices.size(), 1u);
  ASSERT_EQ(kept->models.size(), 4u);  // actor, reference, critic, rollout
  std::map<std::string, RlGroupMemory> by;
  int64_t sum = 0, largest = 0;
  for (const RlGroupMemory& m : kept->models) by[m.model] = m, sum += m.states, largest = std::max(largest, m.pass);
  EXPECT_EQ(kept->devices[0].need(), sum + largest);
  EXPECT_EQ(kept->devices[0].offloaded, 0);
  EXPECT_EQ(kept->devices[0].kv_beside, sum);

  // The actor and the critic take turns; the reference and the rollout model stay.
  for (int g : {0, 1}) spec.mutable_groups(g)->set_offload(true);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  auto turns = PlanRl(spec);
  ASSERT_TRUE(turns.ok()) << turns.status();
  const RlDeviceSet& d = turns->devices[0];
  const int64_t stays = by["reference"].states + by["rollout"].states;
  EXPECT_EQ(d.states, stays);
  EXPECT_EQ(d.offloaded, by["actor"].states + by["critic"].states);
  const int64_t actor_turn = stays + by["actor"].states + by["actor"].pass;
  const int64_t critic_turn = stays + by["critic"].states + by["critic"].pass;
  // The reference stays: it runs beside the actor or the critic, whichever had the turn.
  const int64_t reference_turn = stays + std::max(by["actor"].states, by["critic"].states) + by["reference"].pass;
  EXPECT_EQ(d.need(), std::max({actor_turn, critic_turn, reference_turn}));
  EXPECT_LT(d.need(), kept->devices[0].need());
  // The rollout group stays too, so it generates beside the actor (the sync's turn).
  EXPECT_EQ(d.kv_beside, stays + by["actor"].states);
  EXPECT_THAT(DeviceSetModels(*turns, d), ::testing::HasSubstr("critic 0."));
  EXPECT_THAT(DeviceSetModels(*turns, d), ::testing::HasSubstr("offloaded"));

  // Every group offloads: the weight sync's turn holds the actor and the rollout model.
  for (int g = 0; g < spec.groups_size(); ++g) spec.mutable_groups(g)->set_offload(true);
  auto all = PlanRl(spec);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->devices[0].states, 0);
  EXPECT_EQ(all->devices[0].kv_beside, by["rollout"].states);
  EXPECT_GE(all->devices[0].need(), by["actor"].states + by["rollout"].states);
  EXPECT_EQ(all->devices[0].need(),
            std::max({by["actor"].states + by["actor"].pass, by["critic"].states + by["critic"].pass,
                      by["reference"].states + by["reference"].pass, by["actor"].states + by["rollout"].states}));
}

}  // namespace
}  // namespace tessera::plan
