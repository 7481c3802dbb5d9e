#include "worker/executor/rl_batch.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/rpc/tensor_stream.h"
#include "worker/executor/rollout_pool.h"

namespace tessera::executor {

absl::StatusOr<engine::Rollouts> RolloutsOfBatch(const v1::TensorBatch& batch, int64_t want, int64_t vocab, const char* op) {
  std::vector<std::vector<int32_t>> prompts, completions;
  std::vector<double> rewards;
  std::vector<std::vector<uint8_t>> sampled;
  TESSERA_RETURN_IF_ERROR(BatchToSamples(batch, &prompts, &completions, &rewards, &sampled));
  if (static_cast<int64_t>(prompts.size()) != want)
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", prompts.size(), " samples; this DP rank takes ", want));
  for (const auto* rows : {&prompts, &completions})
    for (const auto& r : *rows)
      for (int32_t t : r)
        if (t < 0 || t >= vocab) return absl::InvalidArgumentError(absl::StrCat(op, ": token ", t, " is outside the vocabulary"));
  return engine::MakeRollouts(prompts, completions, rewards, &sampled);
}

v1::NamedTensor TokenTensor(const std::string& name, const std::vector<engine::RlSample>& samples,
                            std::vector<double> engine::RlSample::*field, int64_t width) {
  std::vector<float> flat(samples.size() * static_cast<size_t>(width), 0.0f);
  for (size_t i = 0; i < samples.size(); ++i) {
    const std::vector<size_t> at = engine::ResponsePositions(samples[i]);
    const std::vector<double>& v = samples[i].*field;
    for (size_t k = 0; k < at.size() && k < static_cast<size_t>(width) && at[k] < v.size(); ++k)
      flat[i * width + k] = static_cast<float>(v[at[k]]);
  }
  return F32Tensor(name, {static_cast<int64_t>(samples.size()), width}, flat);
}

absl::StatusOr<bool> TakeTokenTensor(const v1::TensorBatch& batch, const std::string& name,
                                     std::vector<engine::RlSample>& samples, std::vector<double> engine::RlSample::*field) {
  const v1::NamedTensor* t = nullptr;
  for (const auto& c : batch.tensors())
    if (c.name() == name) t = &c;
  if (t == nullptr) return false;
  const int64_t n = static_cast<int64_t>(samples.size());
  if (t->dtype() != v1::DTYPE_F32 || t->shape_size() != 2 || t->shape(0) != n ||
      t->data().size() != static_cast<size_t>(n * t->shape(1)) * sizeof(float))
    return absl::InvalidArgumentError(absl::StrCat("samples batch: expected ", name, " [", n, ", W] f32"));
  const int64_t width = t->shape(1);
  std::vector<float> flat(static_cast<size_t>(n * width));
  if (!flat.empty()) std::memcpy(flat.data(), t->data().data(), flat.size() * sizeof(float));
  for (int64_t i = 0; i < n; ++i) {
    engine::RlSample& s = samples[i];
    const std::vector<size_t> at = engine::ResponsePositions(s);
    if (static_cast<int64_t>(at.size()) > width)
      return absl::InvalidArgumentError(absl::StrCat("samples batch: ", name, " is ", width, " wide; sample ", i, " has ",
                                                     at.size(), " response tokens"));
    (s.*field).assign(s.mask.size(), 0.0);
    for (size_t k = 0; k < at.size(); ++k) (s.*field)[at[k]] = flat[i * width + k];
  }
  return true;
}

absl::StatusOr<v1::RlForwardStats> ForwardSamples(model::Llama& model, engine::Trainer* trainer, runtime::Backend& backend,
                                                  const v1::RlSpec& rl, int64_t want, const v1::TensorBatch& batch,
                                                  const std::string& name, v1::TensorBatch* out) {
  TESSERA_ASSIGN_OR_RETURN(engine::Rollouts got, RolloutsOfBatch(batch, want, model.config().vocab, "RlForward"));
  int64_t width = 1, tokens = 0;
  for (const auto& t : batch.tensors())
    if (t.name() == "completion" && t.shape_size() == 2) width = t.shape(1);
  for (const engine::RlSample& s : got.samples) tokens += static_cast<int64_t>(s.mask.size());
  backend.allocator()->ResetPeak();
  const auto t0 = std::chrono::steady_clock::now();
  TESSERA_ASSIGN_OR_RETURN(const engine::MicroBatchPlan plan,
                           engine::PlanMicroBatches(trainer, got.samples, rl.mini_batches(), rl.max_tokens_per_micro_batch()));
  std::vector<double> engine::RlSample::*field = model.config().value_head ? &engine::RlSample::old_value
                                                                            : &engine::RlSample::old_logp;
  if (model.config().value_head) {
    TESSERA_RETURN_IF_ERROR(engine::FillValues(model, got.samples, plan));
  } else {
    TESSERA_RETURN_IF_ERROR(engine::FillLogProbs(model, got.samples, plan, field));
  }
  v1::RlForwardStats st;
  st.set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  st.set_tokens(tokens);
  st.set_memory_peak_bytes(backend.allocator()->stats().peak_bytes);
  *out->add_tensors() = TokenTensor(name, got.samples, field, width);
  return st;
}

}  // namespace tessera::executor
