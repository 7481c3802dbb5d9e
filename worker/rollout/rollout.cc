#include "worker/rollout/rollout.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "worker/rollout/rollout_seq.h"

namespace tessera::engine {
using runtime::Tensor;

model::TokenBatch CompletionSequence(const std::vector<int32_t>& prompt, const std::vector<int32_t>& completion,
                                     std::vector<double>* mask) {
  const int32_t p = static_cast<int32_t>(prompt.size()), n = p + static_cast<int32_t>(completion.size());
  std::vector<int32_t> tokens = prompt;
  tokens.insert(tokens.end(), completion.begin(), completion.end());
  if (mask != nullptr)
    for (int32_t i = 0; i < n; ++i) mask->push_back(i + 1 >= p && i + 1 < n ? 1.0 : 0.0);
  return model::TokenBatch::NextTokenSequence(std::move(tokens));
}

RolloutEngine::RolloutEngine(model::Llama* model, const RolloutOptions& options)
    : model_(model),
      options_(options),
      host_(runtime::MakeCpuBackend()),
      device_sampling_(model->backend().device().kind != runtime::DeviceKind::kCpu && !options.sample_on_host) {}

absl::StatusOr<std::unique_ptr<RolloutEngine>> RolloutEngine::Create(model::Llama* model, const RolloutOptions& o) {
  if (model == nullptr) return absl::InvalidArgumentError("rollout: no model");
  if (o.block_size < 1 || o.num_blocks < 1 || o.max_running < 1)
    return absl::InvalidArgumentError(absl::StrCat("rollout: block_size (", o.block_size, "), num_blocks (", o.num_blocks,
                                                   ") and max_running (", o.max_running, ") must be positive"));
  return std::unique_ptr<RolloutEngine>(new RolloutEngine(model, o));
}

void RolloutEngine::ReleaseCache() {
  graphs_.clear();  // they point into the cache
  gen_.reset();
  free_blocks_.clear();
}

namespace {
bool EndsWithAny(const std::vector<int32_t>& tokens, const std::vector<std::vector<int32_t>>& sequences) {
  for (const auto& q : sequences)
    if (!q.empty() && q.size() <= tokens.size() && std::equal(q.rbegin(), q.rend(), tokens.rbegin())) return true;
  return false;
}

absl::Status CheckRequest(const GenerationRequest& r, size_t i, int64_t vocab, int64_t capacity_tokens) {
  auto bad = [&](const std::string& m) { return absl::InvalidArgumentError(absl::StrCat("requests[", i, "]: ", m)); };
  const SamplingParams& p = r.params;
  if (r.prompt.empty()) return bad("empty prompt");
  for (int32_t t : r.prompt)
    if (t < 0 || t >= vocab) return bad(absl::StrCat("prompt token ", t, " is not in the vocabulary [0, ", vocab, ")"));
  for (int32_t t : p.stop_tokens)
    if (t < 0 || t >= vocab) return bad(absl::StrCat("stop token ", t, " is not in the vocabulary [0, ", vocab, ")"));
  for (const auto& seq : p.stop_sequences) {
    if (seq.empty()) return bad("an empty stop sequence");
    for (int32_t t : seq)
      if (t < 0 || t >= vocab) return bad(absl::StrCat("stop sequence token ", t, " is not in the vocabulary [0, ", vocab, ")"));
  }
  if (p.n < 1) return bad(absl::StrCat("n = ", p.n, "; need at least 1"));
  if (p.max_new_tokens < 1) return bad(absl::StrCat("max_new_tokens = ", p.max_new_tokens, "; need at least 1"));
  if (!(p.temperature >= 0)) return bad(absl::StrCat("temperature = ", p.temperature, "; need >= 0"));
  if (!(p.top_p > 0 && p.top_p <= 1)) return bad(absl::StrCat("top_p = ", p.top_p, "; need (0, 1]"));
  if (p.top_k < 0) return bad(absl::StrCat("top_k = ", p.top_k, "; need >= 0 (0: all)"));
  const int64_t need = static_cast<int64_t>(r.prompt.size()) + p.max_new_tokens;
  if (need > capacity_tokens)
    return bad(absl::StrCat("prompt (", r.prompt.size(), ") + max_new_tokens (", p.max_new_tokens, ") = ", need,
                            " tokens; the KV cache holds ", capacity_tokens));
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<std::vector<Completion>> RolloutEngine::Generate(const std::vector<GenerationRequest>& requests) {
  const int64_t bs = options_.block_size, vocab = model_->config().vocab;
  for (size_t i = 0; i < requests.size(); ++i)
    TESSERA_RETURN_IF_ERROR(CheckRequest(requests[i], i, vocab, options_.num_blocks * bs));
  model_->backend().allocator()->ResetPeak();
  if (gen_ == nullptr) TESSERA_RETURN_IF_ERROR(MakeCache(requests));
  if (scratch_block_ >= 0) {  // graphs bake in addresses: drop them when weights or cache moved
    const uint64_t fp = GraphFingerprint();
    if (fp != graph_fingerprint_) graphs_.clear(), graph_fingerprint_ = fp;
  }
  decode_steps_ = prefills_ = graph_steps_ = prefill_tokens_ = peak_blocks_ = 0;
  prefill_s_ = decode_s_ = 0;
  auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  std::vector<std::unique_ptr<Seq>> all;
  for (size_t i = 0; i < requests.size(); ++i)
    for (int j = 0; j < requests[i].params.n; ++j) {
      auto s = std::make_unique<Seq>();
      s->request = static_cast<int64_t>(i), s->sample = j, s->params = &requests[i].params;
      s->tokens = requests[i].prompt;
      s->prompt_len = static_cast<int64_t>(s->tokens.size());
      s->out.request = s->request, s->out.sample = j;
      all.push_back(std::move(s));
    }
  std::deque<Seq*> waiting;
  for (auto& s : all) waiting.push_back(s.get());
  std::vector<Seq*> running;
  auto blocks_for = [&](const Seq& s) { return (s.prompt_len + s.params->max_new_tokens + bs - 1) / bs; };
  auto retire = [&](std::vector<Seq*>& seqs) {  // finished samples give their blocks back (a shared one with its last user)
    std::vector<Seq*> keep;
    for (Seq* s : seqs) {
      if (!s->done) {
        keep.push_back(s);
        continue;
      }
      for (auto b = s->blocks.rbegin(); b != s->blocks.rend(); ++b)
        if (--block_refs_[*b] == 0) free_blocks_.push_back(*b);
      s->blocks.clear();
    }
    seqs = std::move(keep);
  };
  while (!waiting.empty() || !running.empty()) {
    std::vector<Seq*> admitted;
    std::map<int64_t, Seq*> leaders;  // this admission's sample that prefills each request's prompt
    int64_t prefill_tokens = 0;
    while (!waiting.empty() && static_cast<int64_t>(running.size() + admitted.size()) < options_.max_running) {
      Seq* s = waiting.front();
      const auto led = options_.prefix_sharing ? leaders.find(s->request) : leaders.end();
      Seq* leader = led != leaders.end() ? led->second : nullptr;
      const int64_t shared = leader != nullptr ? s->prompt_len / bs : 0;  // the leader's full prompt blocks
      if (static_cast<int64_t>(free_blocks_.size()) < blocks_for(*s) - shared) break;
      if (leader == nullptr && !admitted.empty() && prefill_tokens + s->prompt_len > options_.max_prefill_tokens) break;
      waiting.pop_front();
      if (leader != nullptr) {
        s->leader = leader;
        for (int64_t k = 0; k < shared; ++k) s->blocks.push_back(leader->blocks[k]), ++block_refs_[leader->blocks[k]];
      } else {
        prefill_tokens += s->prompt_len;
        leaders[s->request] = s;
      }
      for (int64_t k = blocks_for(*s) - shared; k > 0; --k) {
        s->blocks.push_back(free_blocks_.back());
        block_refs_[free_blocks_.back()] = 1;
        free_blocks_.pop_back();
      }
      admitted.push_back(s);
    }
    peak_blocks_ = std::max<int64_t>(peak_blocks_, cache_blocks_ - static_cast<int64_t>(free_blocks_.size()));
    if (admitted.empty() && running.empty())  // cannot happen: every request fits an empty cache
      return absl::InternalError("rollout: nothing running and nothing admitted");
    if (!admitted.empty()) {
      const auto t = std::chrono::steady_clock::now();
      TESSERA_RETURN_IF_ERROR(Prefill(admitted));
      prefill_s_ += seconds_since(t);
      retire(admitted);
      running.insert(running.end(), admitted.begin(), admitted.end());
    }
    if (!running.empty()) {
      const auto t = std::chrono::steady_clock::now();
      TESSERA_RETURN_IF_ERROR(Decode(running));
      decode_s_ += seconds_since(t);
      retire(running);
    }
  }
  std::vector<Completion> out;
  for (auto& s : all) out.push_back(std::move(s->out));
  peak_bytes_ = model_->backend().allocator()->stats().peak_bytes;
  return out;
}

int64_t RolloutEngine::cache_bytes() const {
  return gen_ == nullptr ? 0 : cache_blocks_ * model::Generator::CacheBytesPerBlock(*model_, options_.block_size);
}

int64_t KvCacheBlocks(int64_t wanted, int64_t bytes_per_block, const runtime::Backend::DeviceMemory& memory,
                      double utilization) {
  const double budget = utilization * static_cast<double>(memory.total) - static_cast<double>(memory.total - memory.free);
  const double fit = std::floor(std::max(0.0, budget) / static_cast<double>(std::max<int64_t>(1, bytes_per_block)));
  return fit < static_cast<double>(wanted) ? static_cast<int64_t>(fit) : wanted;
}

absl::Status RolloutEngine::MakeCache(const std::vector<GenerationRequest>& requests) {
  const int64_t bs = options_.block_size;
  // With CUDA graphs, blocks past the cache's take the padded rows' writes (one slot per
  // row of the largest padded batch); they are never handed out.
  int64_t pad_rows = 1;
  while (pad_rows < options_.max_running) pad_rows *= 2;
  const int64_t scratch = GraphsUsable() ? (pad_rows + bs - 1) / bs : 0;
  int64_t blocks = options_.num_blocks;
  if (options_.gpu_memory_utilization > 0) {
    auto memory = model_->backend().MemoryInfo();
    if (!memory.ok() && memory.status().code() != absl::StatusCode::kUnimplemented) return memory.status();
    if (memory.ok()) {
      const int64_t bytes_per_block = model::Generator::CacheBytesPerBlock(*model_, bs);
      const int64_t fit = KvCacheBlocks(options_.num_blocks + scratch, bytes_per_block, *memory,
                                        options_.gpu_memory_utilization) - scratch;
      int64_t longest = 0;
      for (const auto& r : requests)
        longest = std::max<int64_t>(longest, (static_cast<int64_t>(r.prompt.size()) + r.params.max_new_tokens + bs - 1) / bs);
      constexpr double kGiB = 1 << 30;
      if (fit < longest)
        return absl::ResourceExhaustedError(absl::StrCat(
            "rollout: the KV cache fits ", std::max<int64_t>(0, fit), " blocks of ", bs, " tokens (",
            absl::StrFormat("%.2f", std::max<int64_t>(0, fit) * bytes_per_block / kGiB), " GiB) within gpu_memory_utilization ",
            options_.gpu_memory_utilization, " of ", absl::StrFormat("%.1f", memory->total / kGiB), " GiB with ",
            absl::StrFormat("%.1f", (memory->total - memory->free) / kGiB), " GiB in use; the longest sequence needs ",
            longest, " blocks (its prompt + max_new_tokens)"));
      blocks = std::min(blocks, fit);
    }
  }
  TESSERA_ASSIGN_OR_RETURN(gen_, model::Generator::Create(model_, blocks + scratch, bs));
  if (scratch > 0) TESSERA_RETURN_IF_ERROR(gen_->ReserveDecodeRows(pad_rows));  // before any capture
  cache_blocks_ = blocks;
  scratch_block_ = scratch > 0 ? blocks : -1;
  free_blocks_.clear();
  for (int64_t b = blocks - 1; b >= 0; --b) free_blocks_.push_back(static_cast<int32_t>(b));
  block_refs_.assign(static_cast<size_t>(blocks), 0);
  return absl::OkStatus();
}

absl::Status RolloutEngine::Prefill(std::vector<Seq*>& admitted) {
  const int64_t bs = options_.block_size;
  model::TokenBatch batch;
  std::vector<int32_t> slots;
  batch.cu_seqlens = {0};
  // The leaders' prompts (a sample sharing one reads its leader's logits row).
  std::map<const Seq*, int64_t> row_of;
  std::vector<int64_t> rows;
  for (Seq* s : admitted) {
    if (s->leader != nullptr) {
      rows.push_back(row_of.at(s->leader));
      continue;
    }
    rows.push_back(static_cast<int64_t>(row_of.size()));
    row_of[s] = rows.back();
    for (int64_t p = 0; p < s->prompt_len; ++p) {
      batch.tokens.push_back(s->tokens[p]);
      batch.positions.push_back(static_cast<int32_t>(p));
      batch.targets.push_back(-1);
      slots.push_back(s->Slot(p, bs));
    }
    batch.cu_seqlens.push_back(static_cast<int32_t>(batch.tokens.size()));
    prefill_tokens_ += s->prompt_len;
  }
  ++prefills_;
  const bool shared = row_of.size() < admitted.size();
  TESSERA_RETURN_IF_ERROR(ForwardAndSample(admitted, batch, slots, nullptr, shared ? &rows : nullptr));
  // Each sharing sample's own copy of the prompt's tokens in its partly filled last block,
  // before any decode step writes a new token there (stream-ordered after the prefill's
  // writes; one copy for all of them).
  std::vector<int32_t> from, to;
  for (Seq* s : admitted)
    if (s->leader != nullptr)
      for (int64_t p = s->prompt_len / bs * bs; p < s->prompt_len; ++p)
        from.push_back(s->leader->Slot(p, bs)), to.push_back(s->Slot(p, bs));
  return gen_->CopySlots(from, to);
}

absl::Status RolloutEngine::Decode(std::vector<Seq*>& running) {
  if (scratch_block_ >= 0 && GraphsUsable()) return DecodeWithGraph(running);
  const int64_t bs = options_.block_size, n = static_cast<int64_t>(running.size());
  model::TokenBatch batch;
  std::vector<int32_t> slots;
  int64_t max_blocks = 1;
  for (Seq* s : running) max_blocks = std::max<int64_t>(max_blocks, s->blocks.size());
  model::DecodeView view;
  TESSERA_ASSIGN_OR_RETURN(view.tables, host_->Empty({n, max_blocks}, DType::kI32));
  TESSERA_ASSIGN_OR_RETURN(view.lens, host_->Empty({n}, DType::kI32));
  int32_t* tables = view.tables.data_as<int32_t>();
  std::fill(tables, tables + n * max_blocks, -1);
  batch.cu_seqlens = {0};
  for (int64_t i = 0; i < n; ++i) {
    Seq* s = running[i];
    const int64_t pos = static_cast<int64_t>(s->tokens.size()) - 1;  // the newest token, not yet in the cache
    batch.tokens.push_back(s->tokens[pos]);
    batch.positions.push_back(static_cast<int32_t>(pos));
    batch.targets.push_back(-1);
    batch.cu_seqlens.push_back(static_cast<int32_t>(i + 1));
    slots.push_back(s->Slot(pos, bs));
    std::copy(s->blocks.begin(), s->blocks.end(), tables + i * max_blocks);
    view.lens.data_as<int32_t>()[i] = static_cast<int32_t>(pos + 1);
  }
  ++decode_steps_;
  return ForwardAndSample(running, batch, slots, &view);
}

absl::Status RolloutEngine::ForwardAndSample(const std::vector<Seq*>& seqs, const model::TokenBatch& batch,
                                             const std::vector<int32_t>& slots, const model::DecodeView* view,
                                             const std::vector<int64_t>* rows) {
  const int64_t n = static_cast<int64_t>(seqs.size()), vocab = model_->config().vocab;
  if (device_sampling_) {  // the logits stay on the device: sampled there
    TESSERA_ASSIGN_OR_RETURN(Tensor local, gen_->ForwardLocal(batch, slots, view));
    // Under TP every rank gathers the whole vocabulary's logits on its device and samples
    // the same tokens (the same logits, seeds and kernel), so the ranks stay in step.
    TESSERA_ASSIGN_OR_RETURN(Tensor logits, gen_->GatherVocab(local));
    if (rows == nullptr) return SampleInto(seqs, logits, model_->backend());
    runtime::Backend& be = model_->backend();  // each sample's row: one gather
    std::vector<int32_t> index(rows->begin(), rows->end());
    TESSERA_ASSIGN_OR_RETURN(Tensor ids, be.Empty({n}, DType::kI32));
    TESSERA_RETURN_IF_ERROR(be.CopyFromHost(index.data(), ids));
    TESSERA_ASSIGN_OR_RETURN(Tensor each, be.Empty({n, logits.dim(1)}, logits.dtype()));
    TESSERA_RETURN_IF_ERROR(be.EmbeddingForward(ids, logits, 0, each));
    return SampleInto(seqs, each, be);
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<float> logits, gen_->Forward(batch, slots, view));
  TESSERA_ASSIGN_OR_RETURN(Tensor z, host_->Empty({n, vocab}, DType::kF32));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows != nullptr ? (*rows)[i] : i;
    std::memcpy(z.data_as<float>() + i * vocab, logits.data() + r * vocab, vocab * sizeof(float));
  }
  return SampleInto(seqs, z, *host_);
}

void RolloutEngine::SamplingInputs(const std::vector<Seq*>& seqs, float* temperature, int32_t* top_k, float* top_p,
                                   int64_t* seed, int64_t* offset) const {
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Seq& s = *seqs[i];
    temperature[i] = s.params->temperature;
    top_k[i] = s.params->top_k;
    top_p[i] = s.params->top_p;
    seed[i] = static_cast<int64_t>(s.params->seed + static_cast<uint64_t>(s.sample));
    offset[i] = static_cast<int64_t>(s.tokens.size()) - s.prompt_len;
  }
}

void RolloutEngine::Append(const std::vector<Seq*>& seqs, const int32_t* token, const float* logprob) {
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq& s = *seqs[i];
    const int32_t t = token[i];
    s.tokens.push_back(t);
    s.out.tokens.push_back(t);
    s.out.logprobs.push_back(logprob[i]);
    const auto& stop = s.params->stop_tokens;
    if (std::find(stop.begin(), stop.end(), t) != stop.end()) {
      s.done = true, s.out.finish_reason = "stop";
    } else if (EndsWithAny(s.out.tokens, s.params->stop_sequences)) {
      s.done = true, s.out.finish_reason = "tool";
    } else if (static_cast<int64_t>(s.out.tokens.size()) >= s.params->max_new_tokens) {
      s.done = true, s.out.finish_reason = "length";
    }
  }
}

absl::Status RolloutEngine::SampleInto(const std::vector<Seq*>& seqs, const Tensor& z, runtime::Backend& be) {
  runtime::Backend& h = *host_;
  const int64_t n = static_cast<int64_t>(seqs.size());
  TESSERA_ASSIGN_OR_RETURN(Tensor temp, h.Empty({n}, DType::kF32));
  TESSERA_ASSIGN_OR_RETURN(Tensor top_k, h.Empty({n}, DType::kI32));
  TESSERA_ASSIGN_OR_RETURN(Tensor top_p, h.Empty({n}, DType::kF32));
  TESSERA_ASSIGN_OR_RETURN(Tensor seed, h.Empty({n}, DType::kI64));
  TESSERA_ASSIGN_OR_RETURN(Tensor offset, h.Empty({n}, DType::kI64));
  TESSERA_ASSIGN_OR_RETURN(Tensor token, h.Empty({n}, DType::kI32));
  TESSERA_ASSIGN_OR_RETURN(Tensor logprob, h.Empty({n}, DType::kF32));
  SamplingInputs(seqs, temp.data_as<float>(), top_k.data_as<int32_t>(), top_p.data_as<float>(), seed.data_as<int64_t>(),
                 offset.data_as<int64_t>());
  if (&be == &h) {
    TESSERA_RETURN_IF_ERROR(h.Sample(z, temp, top_k, top_p, seed, offset, token, logprob));
  } else {  // the per-row parameters up, the tokens and log-probs down
    auto up = [&](const Tensor& x) -> absl::StatusOr<Tensor> {
      TESSERA_ASSIGN_OR_RETURN(Tensor d, be.Empty(x.shape(), x.dtype()));
      TESSERA_RETURN_IF_ERROR(be.CopyFromHost(x.data(), d));
      return d;
    };
    TESSERA_ASSIGN_OR_RETURN(Tensor d_temp, up(temp));
    TESSERA_ASSIGN_OR_RETURN(Tensor d_top_k, up(top_k));
    TESSERA_ASSIGN_OR_RETURN(Tensor d_top_p, up(top_p));
    TESSERA_ASSIGN_OR_RETURN(Tensor d_seed, up(seed));
    TESSERA_ASSIGN_OR_RETURN(Tensor d_offset, up(offset));
    TESSERA_ASSIGN_OR_RETURN(Tensor d_token, be.Empty({n}, DType::kI32));
    TESSERA_ASSIGN_OR_RETURN(Tensor d_logprob, be.Empty({n}, DType::kF32));
    TESSERA_RETURN_IF_ERROR(be.Sample(z, d_temp, d_top_k, d_top_p, d_seed, d_offset, d_token, d_logprob));
    TESSERA_RETURN_IF_ERROR(be.CopyToHost(d_token, token.data()));
    TESSERA_RETURN_IF_ERROR(be.CopyToHost(d_logprob, logprob.data()));
  }
  Append(seqs, token.data_as<int32_t>(), logprob.data_as<float>());
  return absl::OkStatus();
}

}  // namespace tessera::engine
