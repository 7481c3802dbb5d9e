// The executor's operations without gRPC: one CPU rank per group (self communicators, no
// rendezvous), a tiny Llama.
#include "worker/executor/executor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/worker/executor/executor_test_util.h"

namespace tessera::executor {
namespace {

using ::testing::HasSubstr;

using test::For;
v1::ExecutorConfig Config(const std::string& kind) { return test::OneRankConfig(kind); }

TEST(Executor, OperationsOutOfOrderAreRefusedAndTheSessionCarriesOn) {
  Executor ex(Config("pretrain"), /*rdv=*/nullptr, "127.0.0.1");
  EXPECT_EQ(ex.InitGroup(For<v1::InitGroupRequest>("critic")).status().code(), absl::StatusCode::kNotFound);
  auto early = ex.TrainInit(For<v1::TrainInitRequest>("actor"));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(early.status().message()), HasSubstr("call InitGroup first"));
  auto init = ex.InitGroup(For<v1::InitGroupRequest>("actor"));
  ASSERT_TRUE(init.ok()) << init.status();
  EXPECT_GT(init->communicators_size(), 0);
  auto step = For<v1::TrainStepRequest>("actor");
  EXPECT_THAT(std::string(ex.TrainStep(step).status().message()), HasSubstr("call TrainInit first"));
  auto started = ex.TrainInit(For<v1::TrainInitRequest>("actor"));
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(started->start_step(), 0);
  auto s0 = ex.TrainStep(step);
  ASSERT_TRUE(s0.ok()) << s0.status();
  EXPECT_GT(s0->loss(), 0);
  EXPECT_GT(s0->grad_norm(), 0);
  EXPECT_GT(s0->tokens(), 0);
  EXPECT_GT(s0->model_flops(), 0);
  EXPECT_FALSE(s0->has_checkpoint_seconds());  // no train.checkpoint
  step.set_step(2);  // skips step 1
  EXPECT_EQ(ex.TrainStep(step).status().code(), absl::StatusCode::kFailedPrecondition);
  // A pretrain session has no RL operations: refused, naming the operation and the kind.
  auto rl = ex.RlUpdate(For<v1::RlUpdateHeader>("actor"), {});
  EXPECT_EQ(rl.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(rl.status().message()), HasSubstr("RlUpdate: group 'actor' trains a pretrain job"));
  v1::TensorBatch none_out;
  auto gen = ex.RolloutGenerate(For<v1::RolloutGenerateRequest>("actor"), &none_out);
  EXPECT_THAT(std::string(gen.status().message()), HasSubstr("RolloutGenerate: group 'actor' trains a pretrain job"));
  auto cc = For<v1::CommCheckRequest>("actor");
  cc.set_group_kind("dp");
  EXPECT_THAT(std::string(ex.CommCheck(cc).status().message()), HasSubstr("iters: 0; expected at least 1"));
  cc.set_iters(1), cc.set_dtype(v1::DTYPE_F32);
  auto none = ex.CommCheck(cc);  // a group of one rank: nothing to check
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->results_size(), 0);
  step.set_step(1);
  auto s1 = ex.TrainStep(step);
  ASSERT_TRUE(s1.ok()) << s1.status();
  EXPECT_NE(s1->loss(), s0->loss());
}

// grpo with no rollout group: the actor's session generates the samples that its update
// then takes, phase by phase as the driver calls them.
TEST(Executor, AnActorWithoutARolloutGroupGeneratesAndUpdates) {
  Executor ex(Config("grpo"), nullptr, "127.0.0.1");
  ASSERT_TRUE(ex.InitGroup(For<v1::InitGroupRequest>("actor")).ok());
  ASSERT_TRUE(ex.TrainInit(For<v1::TrainInitRequest>("actor")).ok());
  // An RL actor is trained by RlUpdate, not TrainStep: refused by name, nothing changed.
  auto wrong = ex.TrainStep(For<v1::TrainStepRequest>("actor"));
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("the actor of a grpo job, which RlUpdate trains"));
  auto gen = For<v1::RolloutGenerateRequest>("actor");
  v1::TensorBatch samples;
  auto stats = ex.RolloutGenerate(gen, &samples);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->samples(), 4);  // 2 prompts x group_size 2
  ASSERT_GT(samples.tensors_size(), 0);
  EXPECT_EQ(samples.tensors(0).shape(0), 4);
  // A batch without its rewards is refused, naming the tensor; the session is unharmed.
  v1::TensorBatch partial = samples;
  for (int i = 0; i < partial.tensors_size(); ++i)
    if (partial.tensors(i).name() == "reward") partial.mutable_tensors()->DeleteSubrange(i, 1);
  auto header = For<v1::RlUpdateHeader>("actor");
  auto bad = ex.RlUpdate(header, partial);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("reward"));
  auto upd = ex.RlUpdate(header, samples);
  ASSERT_TRUE(upd.ok()) << upd.status();
  EXPECT_EQ(upd->samples(), 4);
  EXPECT_GT(upd->grad_norm(), 0);  // the entropy bonus has a gradient whatever the rewards
  EXPECT_DOUBLE_EQ(upd->reward(), stats->reward());
  auto eval = For<v1::RlEvalRequest>("actor");
  eval.set_problems(3);
  auto acc = ex.RlEval(eval);
  ASSERT_TRUE(acc.ok()) << acc.status();
  EXPECT_EQ(acc->problems(), 3);
  EXPECT_LE(acc->correct(), 3);
  // No bridge: there is no rollout group on devices of its own.
  EXPECT_THAT(std::string(ex.SyncWeights(For<v1::SyncWeightsRequest>("actor")).status().message()),
              HasSubstr("call BridgeInit first"));
  auto digest = ex.WeightsDigest(For<v1::WeightsDigestRequest>("actor"));
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_FALSE(digest->digest().empty());
}

}  // namespace
}  // namespace tessera::executor
