// The rollout engine's per-sample state and a step's plan (private to rollout.cc,
// rollout_step.cc and rollout_graph.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "worker/rollout/rollout.h"

namespace tessera::engine {

struct RolloutEngine::Seq {
  int64_t request = 0;
  int sample = 0;
  const SamplingParams* params = nullptr;
  std::vector<int32_t> tokens;  // known on the host: the prompt, then the new tokens collected
  int64_t prompt_len = 0;
  std::vector<int32_t> blocks;  // the cache blocks of its positions, in order (the first may be shared)
  // Prefix sharing: the sample of the same request admitted with it whose prompt it shares
  // (null: it prefills its own). Its first prompt_len / block_size blocks are the leader's;
  // the partly filled one after them is a copy made after the leader's prefill.
  Seq* leader = nullptr;
  int64_t computed = 0;     // positions whose keys and values a launched step writes into the cache
  int64_t prefill_end = 0;  // the tokens known at its admission: its prompt, or all it had when preempted
  int inflight = 0;      // tokens sampled by launched steps, not yet collected (at most 2)
  int last_row = -1;     // the row of its newest such token in the last launched step's samples
  int64_t admitted = 0;  // admission order (preemption takes the latest)
  Completion out;
  bool done = false;
  // Positions known: the host's tokens and those in flight.
  int64_t Known() const { return static_cast<int64_t>(tokens.size()) + inflight; }
  int64_t Generated() const { return Known() - prompt_len; }
  // Where the token at `pos` is for a step's inputs (Backend::Select): its value on the
  // host (source -1), or, sampled by the step in flight, that step's row.
  void TokenAt(int64_t pos, int32_t* value, int32_t* source) const {
    const bool on_host = pos < static_cast<int64_t>(tokens.size());
    *value = on_host ? tokens[pos] : 0, *source = on_host ? -1 : last_row;
  }
  int32_t Slot(int64_t pos, int64_t block_size) const {
    return static_cast<int32_t>(blocks[pos / block_size] * block_size + pos % block_size);
  }
};

// One step: its rows are the fresh samples' tokens (nothing cached: they attend to each
// other) and then one row per token that attends to the cache (prompt chunks after a
// sample's first, decode rows).
struct RolloutEngine::Plan {
  struct Rows {
    Seq* seq;
    int64_t first, count;  // positions [first, first + count)
  };
  std::vector<Rows> fresh, paged;
  std::vector<Seq*> sampled;       // the samples drawing a token this step, in order
  std::vector<int64_t> sample_of;  // each one's logits row (a follower: its leader's last row)
  std::vector<int32_t> copy_from, copy_to;  // followers' copies of their leader's partial block
  int64_t prompt_rows = 0, decode_rows = 0;
  bool empty() const { return fresh.empty() && paged.empty(); }
  bool decode_only() const { return fresh.empty() && prompt_rows == 0 && copy_to.empty(); }
};

struct RolloutEngine::Launched {
  std::vector<Seq*> sampled;
  int slot = 0;  // the host buffer and event its tokens land by
  bool pending = false;
};

}  // namespace tessera::engine
