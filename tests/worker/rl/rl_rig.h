// The RL engine tests' rig (grpo_test, ppo_test): a tiny random actor with its frozen
// reference copy, the actor's trainer (lr 3e-2, clip 1) and a rollout engine on the actor;
// with `critic`, a value-head model too (its own seed) and its trainer (lr 1e-2).
#pragma once

#include <memory>

#include "tests/worker/model/model_test_util.h"
#include "worker/rollout/rollout.h"
#include "worker/train/trainer.h"

namespace tessera::engine::test {

struct RlRig {
  std::unique_ptr<runtime::Backend> be = runtime::MakeCpuBackend();
  std::unique_ptr<model::Llama> actor, ref, critic;
  std::unique_ptr<Trainer> trainer, critic_trainer;
  std::unique_ptr<RolloutEngine> rollout;
  explicit RlRig(bool with_critic = false) {
    model::LlamaConfig c = model::test::TinyConfig(16, /*tied=*/false, /*bias=*/false);
    c.hidden = 32, c.ffn = 48;
    actor = std::move(*model::Llama::Create(c, be.get()));
    ref = std::move(*model::Llama::Create(c, be.get()));
    EXPECT_TRUE(actor->InitRandom(8, 0.05f).ok());
    EXPECT_TRUE(ref->InitRandom(8, 0.05f).ok());
    OptimizerOptions o;
    o.lr = 3e-2f, o.min_lr = 3e-2f, o.warmup_steps = 0, o.total_steps = 1000, o.clip_norm = 1.f;
    trainer = std::move(*Trainer::Create(actor.get(), be.get(), nullptr, nullptr, o));
    if (with_critic) {
      c.value_head = true;
      critic = std::move(*model::Llama::Create(c, be.get()));
      EXPECT_TRUE(critic->InitRandom(9, 0.05f).ok());
      o.lr = o.min_lr = 1e-2f;
      critic_trainer = std::move(*Trainer::Create(critic.get(), be.get(), nullptr, nullptr, o));
    }
    RolloutOptions ro;
    ro.block_size = 4, ro.num_blocks = 128;
    rollout = std::move(*RolloutEngine::Create(actor.get(), ro));
  }
};

}  // namespace tessera::engine::test
