// The rollout engine's per-sample state (private to rollout.cc and rollout_graph.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "worker/rollout/rollout.h"

namespace tessera::engine {

struct RolloutEngine::Seq {
  int64_t request = 0;
  int sample = 0;
  const SamplingParams* params = nullptr;
  std::vector<int32_t> tokens;  // the prompt, then what was generated
  int64_t prompt_len = 0;
  std::vector<int32_t> blocks;  // reserved for prompt + max_new_tokens (the first may be shared: below)
  // Prefix sharing: the sample of the same request admitted with it whose prompt it shares
  // (null: it prefills its own). Its first prompt_len / block_size blocks are the leader's;
  // the partly filled one after them is a copy (Prefill).
  Seq* leader = nullptr;
  Completion out;
  bool done = false;
  int32_t Slot(int64_t pos, int64_t block_size) const {
    return static_cast<int32_t>(blocks[pos / block_size] * block_size + pos % block_size);
  }
};

}  // namespace tessera::engine
