// The executor's side of a generate job (batch inference, docs/design.md §7): the model (TP over
// the group's TP ranks) with its weights (generate.checkpoint, or model.hf_dir), the
// rollout engine on it, and this DP rank's share of the input file's prompts.
// Threading: one call at a time (the executor serializes them).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "tessera/v1/common.pb.h"
#include "tessera/v1/executor_service.pb.h"
#include "worker/rollout/rollout.h"
#include "worker/executor/executor.h"
#include "worker/tokenizer/model_text.h"

namespace tessera::executor {

class GenerateSession {
 public:
  static absl::StatusOr<std::unique_ptr<GenerateSession>> Create(const v1::JobSpec& spec, GroupComms& comms,
                                                                 v1::DeviceType device, int device_index);
  // Each input line is {"prompt": text, ...} (encoded with the tokenizer's special
  // tokens, e.g. Llama-3's BOS) or {"messages": [{"role", "content"}...], ...} (the chat
  // template with the generation prompt, then encoded as it is). Completions stop at
  // generate.stop's tokens and, with a tokenizer.json, the model's EOS tokens; their
  // text is decoded without special tokens.
  // Generates this DP rank's prompts (lines [r·N/dp, (r+1)·N/dp) of the input) and, on TP
  // rank 0, writes them to <output>.part-<r>; after a barrier over the DP group, DP rank 0
  // (TP rank 0) joins the parts in order into <output> (a temporary file renamed) and
  // removes them. Every rank must call it. Returns prompts, completions, tokens (this DP
  // rank's), seconds, and output on the rank that wrote it. INVALID_ARGUMENT naming the
  // file and line for a line without a "prompt" string or "messages" list (or messages
  // the chat template refuses), and naming generate.cache_tokens
  // when the cache cannot hold the longest prompt + max_new_tokens; NOT_FOUND for a
  // missing input.
  absl::StatusOr<v1::GenerateResponse> Run();

 private:
  GenerateSession() = default;
  absl::Status LoadText(const v1::JobSpec& spec, int64_t model_vocab);
  absl::StatusOr<std::vector<int32_t>> PromptOf(const nlohmann::json& line) const;
  v1::GenerateSpec g_;
  std::unique_ptr<runtime::Backend> backend_;
  std::unique_ptr<model::Llama> model_;
  tokenizer::ModelText text_;
  std::vector<int32_t> stop_ids_;
  comm::Communicator* tp_ = nullptr;
  comm::Communicator* dp_ = nullptr;
  int dp_rank_ = 0, dps_ = 1;
};

}  // namespace tessera::executor
