// The rollout engine's steps (rollout.h): a plan's rows through the model over the cache
// (or a captured decode graph: rollout_graph.cc), its samples drawn on the model's device
// into step_tokens_, and their way back to the host — a download into page-locked memory
// and an event, waited for only when the next step is already launched.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/rollout/rollout_seq.h"

namespace tessera::engine {
using runtime::Tensor;

namespace {
bool EndsWithAny(const std::vector<int32_t>& tokens, const std::vector<std::vector<int32_t>>& sequences) {
  for (const auto& q : sequences)
    if (!q.empty() && q.size() <= tokens.size() && std::equal(q.rbegin(), q.rend(), tokens.rbegin())) return true;
  return false;
}

absl::StatusOr<Tensor> Upload(runtime::Backend& be, const void* host, std::vector<int64_t> shape, DType t) {
  TESSERA_ASSIGN_OR_RETURN(Tensor d, be.Empty(std::move(shape), t));
  TESSERA_RETURN_IF_ERROR(be.CopyFromHost(host, d));
  return d;
}
}  // namespace

absl::Status RolloutEngine::Launch(const Plan& plan, Launched& out) {
  if (plan.prompt_rows > 0) ++prefills_, prefill_tokens_ += plan.prompt_rows;
  if (plan.decode_rows > 0) ++decode_steps_;
  decode_rows_ += plan.decode_rows;
  for (const Plan::Rows& r : plan.paged) attended_tokens_ += r.count * r.first + r.count * (r.count + 1) / 2;
  if (plan.decode_only() && scratch_block_ >= 0 && GraphsUsable()) return LaunchGraph(plan, out);
  return LaunchEager(plan, out);
}

absl::Status RolloutEngine::LaunchEager(const Plan& plan, Launched& out) {
  runtime::Backend& be = model_->backend();
  const int64_t bs = options_.block_size;
  model::Generator::StepRows r;
  std::vector<int32_t> values, src;
  r.max_blocks = 1;
  for (const Plan::Rows& rows : plan.paged) r.max_blocks = std::max<int64_t>(r.max_blocks, rows.seq->blocks.size());
  auto add = [&](const Plan::Rows& rows, bool paged) {
    const Seq& s = *rows.seq;
    for (int64_t p = rows.first; p < rows.first + rows.count; ++p) {
      int32_t value, source;
      s.TokenAt(p, &value, &source);
      values.push_back(value), src.push_back(source);
      r.positions.push_back(static_cast<int32_t>(p)), r.slots.push_back(s.Slot(p, bs));
      if (!paged) continue;
      r.lens.push_back(static_cast<int32_t>(p + 1));
      const size_t at = r.tables.size();
      r.tables.resize(at + r.max_blocks, -1);
      std::copy(s.blocks.begin(), s.blocks.end(), r.tables.begin() + at);
    }
  };
  if (!plan.fresh.empty()) r.cu_seqlens = {0};
  for (const Plan::Rows& rows : plan.fresh) {
    add(rows, false);
    r.cu_seqlens.push_back(static_cast<int32_t>(values.size()));
  }
  for (const Plan::Rows& rows : plan.paged) add(rows, true);
  const int64_t t = static_cast<int64_t>(values.size());
  TESSERA_ASSIGN_OR_RETURN(Tensor host_values, Upload(be, values.data(), {t}, DType::kI32));
  if (std::any_of(src.begin(), src.end(), [](int32_t x) { return x >= 0; })) {
    TESSERA_ASSIGN_OR_RETURN(r.tokens, be.Empty({t}, DType::kI32));
    TESSERA_ASSIGN_OR_RETURN(Tensor src_t, host_->Empty({t}, DType::kI32));
    std::copy(src.begin(), src.end(), src_t.data_as<int32_t>());
    TESSERA_RETURN_IF_ERROR(be.Select(src_t, step_tokens_, host_values, r.tokens));
  } else {
    r.tokens = host_values;
  }
  r.logits_of = plan.sample_of;
  // One row per sample, each its next token: the keys and values go in with the attention.
  r.decode_only = plan.fresh.empty() && plan.prompt_rows == 0 &&
                  std::all_of(plan.paged.begin(), plan.paged.end(), [](const Plan::Rows& x) { return x.count == 1; });
  TESSERA_ASSIGN_OR_RETURN(Tensor local, gen_->Step(r));
  if (!plan.sampled.empty()) {
    // Under TP every rank gathers the whole vocabulary's logits on its device and samples
    // the same tokens (the same logits, seeds and kernel), so the ranks stay in step.
    TESSERA_ASSIGN_OR_RETURN(Tensor logits, gen_->GatherVocab(local));
    TESSERA_RETURN_IF_ERROR(SampleRows(plan.sampled, logits));
  }
  // Followers' own copy of the prompt's partly filled last block, before any step writes
  // their new tokens there (stream-ordered after this step's writes).
  TESSERA_RETURN_IF_ERROR(gen_->CopySlots(plan.copy_from, plan.copy_to));
  out.sampled = plan.sampled;
  return FinishLaunch(out);
}

absl::Status RolloutEngine::FinishLaunch(Launched& out) {
  for (size_t i = 0; i < out.sampled.size(); ++i) ++out.sampled[i]->inflight, out.sampled[i]->last_row = static_cast<int>(i);
  out.pending = !out.sampled.empty();
  if (!out.pending) return absl::OkStatus();
  out.slot = next_slot_, next_slot_ ^= 1;
  char* host = host_out_[out.slot].get();
  // One download of the tokens and log-probs (the whole buffer, a few KiB; the rows past
  // the sampled ones are not read).
  TESSERA_RETURN_IF_ERROR(model_->backend().CopyToHostAsync(step_out_, host));
  return landed_[out.slot]->Record();
}

absl::Status RolloutEngine::Collect(Launched& step) {
  if (!step.pending) return absl::OkStatus();
  step.pending = false;
  TESSERA_RETURN_IF_ERROR(landed_[step.slot]->Wait());
  const char* host = host_out_[step.slot].get();
  const int32_t* tok = reinterpret_cast<const int32_t*>(host);
  const float* lp = reinterpret_cast<const float*>(host + step_tokens_.numel() * 4);
  for (size_t i = 0; i < step.sampled.size(); ++i) {
    Seq& s = *step.sampled[i];
    --s.inflight;
    if (!s.done) Append(s, tok[i], lp[i]);  // (done: a row launched before its end was known)
  }
  return absl::OkStatus();
}

void RolloutEngine::SamplingInputs(const std::vector<Seq*>& seqs, float* temperature, int32_t* top_k, float* top_p,
                                   int64_t* seed, int64_t* offset) const {
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Seq& s = *seqs[i];
    temperature[i] = s.params->temperature;
    top_k[i] = s.params->top_k;
    top_p[i] = s.params->top_p;
    seed[i] = static_cast<int64_t>(s.params->seed + static_cast<uint64_t>(s.sample));
    offset[i] = s.Generated();  // the new token's index among the sample's new tokens
  }
}

void RolloutEngine::Append(Seq& s, int32_t token, float logprob) {
  s.tokens.push_back(token);
  s.out.tokens.push_back(token);
  s.out.logprobs.push_back(logprob);
  const auto& stop = s.params->stop_tokens;
  if (std::find(stop.begin(), stop.end(), token) != stop.end()) {
    s.done = true, s.out.finish_reason = "stop";
  } else if (EndsWithAny(s.out.tokens, s.params->stop_sequences)) {
    s.done = true, s.out.finish_reason = "tool";
  } else if (static_cast<int64_t>(s.out.tokens.size()) >= s.params->max_new_tokens) {
    s.done = true, s.out.finish_reason = "length";
  }
}

absl::Status RolloutEngine::SampleRows(const std::vector<Seq*>& seqs, const Tensor& logits) {
  runtime::Backend& be = model_->backend();
  const int64_t n = static_cast<int64_t>(seqs.size());
  std::vector<float> temp(n), top_p(n);
  std::vector<int32_t> top_k(n);
  std::vector<int64_t> seed(n), offset(n);
  SamplingInputs(seqs, temp.data(), top_k.data(), top_p.data(), seed.data(), offset.data());
  TESSERA_ASSIGN_OR_RETURN(Tensor tok, step_tokens_.Slice(0, 0, n));
  TESSERA_ASSIGN_OR_RETURN(Tensor lp, step_logprobs_.Slice(0, 0, n));
  const bool on_host = options_.sample_on_host && be.device().kind != runtime::DeviceKind::kCpu;
  runtime::Backend& sb = on_host ? *host_ : be;  // where the draw runs
  TESSERA_ASSIGN_OR_RETURN(Tensor d_temp, Upload(sb, temp.data(), {n}, DType::kF32));
  TESSERA_ASSIGN_OR_RETURN(Tensor d_top_k, Upload(sb, top_k.data(), {n}, DType::kI32));
  TESSERA_ASSIGN_OR_RETURN(Tensor d_top_p, Upload(sb, top_p.data(), {n}, DType::kF32));
  TESSERA_ASSIGN_OR_RETURN(Tensor d_seed, Upload(sb, seed.data(), {n}, DType::kI64));
  TESSERA_ASSIGN_OR_RETURN(Tensor d_offset, Upload(sb, offset.data(), {n}, DType::kI64));
  if (!on_host) return be.Sample(logits, d_temp, d_top_k, d_top_p, d_seed, d_offset, tok, lp);
  // The logits through the host (tests: the host's draw on a GPU model's logits), the
  // drawn tokens back to the device as the device's draw would leave them.
  TESSERA_ASSIGN_OR_RETURN(Tensor f32, be.Empty(logits.shape(), DType::kF32));
  TESSERA_RETURN_IF_ERROR(be.Cast(logits, f32));
  TESSERA_ASSIGN_OR_RETURN(Tensor z, host_->Empty(logits.shape(), DType::kF32));
  TESSERA_RETURN_IF_ERROR(be.CopyToHost(f32, z.data()));
  TESSERA_ASSIGN_OR_RETURN(Tensor h_tok, host_->Empty({n}, DType::kI32));
  TESSERA_ASSIGN_OR_RETURN(Tensor h_lp, host_->Empty({n}, DType::kF32));
  TESSERA_RETURN_IF_ERROR(host_->Sample(z, d_temp, d_top_k, d_top_p, d_seed, d_offset, h_tok, h_lp));
  TESSERA_RETURN_IF_ERROR(be.CopyFromHost(h_tok.data(), tok));
  TESSERA_RETURN_IF_ERROR(be.CopyFromHost(h_lp.data(), lp));
  return be.Synchronize();  // the host tensors go out of scope
}

}  // namespace tessera::engine
