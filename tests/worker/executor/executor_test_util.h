// What the executor tests share: the config of an executor hosting rank 0 of a one-rank
// CPU group "actor" training a tiny Llama, and requests naming a group.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"
#include "tessera/v1/node_service.pb.h"

namespace tessera::executor::test {

// kind: pretrain, grpo or ppo (the RL kinds with a small rl section, the entropy bonus on
// so that every update has a gradient whatever the rewards). Executor 0, secret
// "attempt-secret".
inline v1::ExecutorConfig OneRankConfig(const std::string& kind) {
  auto spec = ParseJobSpecYaml(absl::StrCat(
      "name: ex\nkind: ", kind, "\ngroups:\n  - name: actor\n    devices: 1\n"
      "model: {vocab_size: 256, hidden: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, ffn: 48, seq_len: 16,\n"
      "        global_batch: 4, micro_batch: 2}\n"
      "train: {steps: 3, lr: 1.0e-2, seed: 5, data: {digits: 1}}\n",
      kind == "pretrain" ? "" : "rl: {group_size: 2, prompts_per_step: 2, max_new_tokens: 4, kl_coef: 0.01, entropy_coef: 0.01}\n"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(NormalizeAndValidateJobSpec(*spec).ok());
  v1::ExecutorConfig cfg;
  cfg.set_job_id("j1");
  cfg.set_executor(0);
  cfg.set_secret("attempt-secret");
  cfg.set_device_type(v1::DEVICE_TYPE_CPU);
  *cfg.mutable_spec() = *spec;
  auto* r = cfg.add_ranks();
  r->set_group("actor");
  r->set_rank(0);
  return cfg;
}

template <class Req>
Req For(const std::string& group) {
  Req r;
  r.set_group(group);
  return r;
}

}  // namespace tessera::executor::test
