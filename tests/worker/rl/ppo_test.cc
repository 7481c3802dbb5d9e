// One PPO step's pieces together (worker/rl/ppo.h) on the CPU backend: a tiny random
// policy with a fresh critic, rewarded for the fraction of its completion tokens that are
// token 3, gets better; the critic's values follow the returns. Bad options are refused
// by name.
#include "worker/rl/ppo.h"

#include <iostream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/worker/rl/rl_rig.h"
#include "tests/worker/model/model_test_util.h"

namespace tessera::engine {
namespace {
using ::testing::HasSubstr;
using model::Llama;

using Rig = test::RlRig;

BatchRewardFn Hits() {
  return [](const std::vector<Completion>& cs) -> absl::StatusOr<std::vector<double>> {
    std::vector<double> r;
    for (const Completion& c : cs) {
      double hits = 0;
      for (int32_t t : c.tokens) hits += t == 3;
      r.push_back(hits / c.tokens.size());
    }
    return r;
  };
}

TEST(Ppo, ThePolicyGetsBetterAndTheCriticLearns) {
  Rig s(/*with_critic=*/true);
  PpoOptions o;
  o.samples_per_prompt = 8;
  o.sampling.temperature = 1.f, o.sampling.max_new_tokens = 6;
  o.kl_reward_coef = 0.01;
  o.mini_batches = 2;
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 5}, {7, 7}, {4, 9, 11, 2}, {0}};
  std::vector<double> rewards, value_losses;
  for (int step = 0; step < 12; ++step) {
    auto st = PpoStep(*s.rollout, *s.actor, *s.trainer, *s.critic, *s.critic_trainer, s.ref.get(), prompts, Hits(), o, step);
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->optimizer_steps, 2);
    EXPECT_EQ(st->response_length, 6);
    rewards.push_back(st->reward);
    value_losses.push_back(st->value_loss);
    if (step == 0) {
      EXPECT_EQ(st->reward_kl, 0);  // the actor starts as the reference
    }
    if (step == 11) {
      EXPECT_GT(st->reward_kl, 0);  // and moves away
    }
  }
  std::cout << "rewards: " << ::testing::PrintToString(rewards) << "\nvalue losses: " << ::testing::PrintToString(value_losses)
            << "\n";
  EXPECT_LT(rewards.front(), 0.2);
  EXPECT_GT(rewards.back(), 0.5) << "rewards: " << ::testing::PrintToString(rewards);
  EXPECT_LT(value_losses.back(), 0.25 * value_losses.front());  // the critic tracks the returns
  EXPECT_EQ(s.trainer->step(), 24);
  EXPECT_EQ(s.critic_trainer->step(), 24);
}

TEST(Ppo, RefusesBadOptions) {
  Rig s(/*with_critic=*/true);
  PpoOptions o;
  auto run = [&](model::Llama* ref, Llama& critic) {
    return std::string(PpoStep(*s.rollout, *s.actor, *s.trainer, critic, *s.critic_trainer, ref, {{1}}, Hits(), o, 0)
                           .status()
                           .message());
  };
  o.samples_per_prompt = 0;
  EXPECT_THAT(run(nullptr, *s.critic), HasSubstr("samples_per_prompt 0"));
  o = PpoOptions();
  o.kl_reward_coef = 0.1;
  EXPECT_THAT(run(nullptr, *s.critic), HasSubstr("needs a reference model"));
  o = PpoOptions();
  EXPECT_THAT(run(nullptr, *s.ref), HasSubstr("the critic needs a value head"));
  o.mini_batches = 5;
  EXPECT_THAT(run(nullptr, *s.critic), HasSubstr("5 mini-batches of 1 samples"));
}

}  // namespace
}  // namespace tessera::engine
