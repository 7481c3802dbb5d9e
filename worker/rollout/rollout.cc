// The rollout engine's requests, cache and scheduling (rollout.h); the steps themselves are
// rollout_step.cc's and rollout_graph.cc's.
#include "worker/rollout/rollout.h"

#include <algorithm>
#include <chrono>
#include <cmath>
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
    : model_(model), options_(options), host_(runtime::MakeCpuBackend()) {}

absl::StatusOr<std::unique_ptr<RolloutEngine>> RolloutEngine::Create(model::Llama* model, const RolloutOptions& o) {
  if (model == nullptr) return absl::InvalidArgumentError("rollout: no model");
  if (o.block_size < 1 || o.num_blocks < 1 || o.max_running < 1 || o.max_prefill_tokens < 1)
    return absl::InvalidArgumentError(absl::StrCat("rollout: block_size (", o.block_size, "), num_blocks (", o.num_blocks,
                                                   "), max_running (", o.max_running, ") and max_prefill_tokens (",
                                                   o.max_prefill_tokens, ") must be positive"));
  return std::unique_ptr<RolloutEngine>(new RolloutEngine(model, o));
}

void RolloutEngine::ReleaseCache() {
  graphs_.clear();  // they point into the cache
  gen_.reset();
  free_blocks_.clear();
  step_tokens_ = Tensor(), step_logprobs_ = Tensor(), step_out_ = Tensor();
}

namespace {
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
  const int64_t vocab = model_->config().vocab;
  for (size_t i = 0; i < requests.size(); ++i)
    TESSERA_RETURN_IF_ERROR(CheckRequest(requests[i], i, vocab, options_.num_blocks * options_.block_size));
  model_->backend().allocator()->ResetPeak();
  if (gen_ == nullptr) TESSERA_RETURN_IF_ERROR(MakeCache(requests));
  if (scratch_block_ >= 0) {  // graphs bake in addresses: drop them when weights or cache moved
    const uint64_t fp = GraphFingerprint();
    if (fp != graph_fingerprint_) graphs_.clear(), graph_fingerprint_ = fp;
  }
  decode_steps_ = prefills_ = graph_steps_ = prefill_tokens_ = peak_blocks_ = preemptions_ = 0;
  decode_rows_ = attended_tokens_ = 0;
  prefill_s_ = decode_s_ = 0;
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
  auto retire = [&] {  // finished samples give their blocks back (a shared one with its last user)
    std::vector<Seq*> keep;
    for (Seq* s : running) {
      if (s->done) FreeBlocks(*s);
      else keep.push_back(s);
    }
    running = std::move(keep);
  };
  Launched in_flight;  // the step launched last, its tokens not collected yet
  auto collect = [&]() -> absl::Status {
    if (!in_flight.pending) return absl::OkStatus();
    TESSERA_RETURN_IF_ERROR(Collect(in_flight));
    retire();
    return absl::OkStatus();
  };
  // Whatever ends the loop, nothing is left running on the device with this call's samples.
  auto fail = [&](absl::Status s) {
    (void)model_->backend().Synchronize();
    for (auto& q : all) FreeBlocks(*q);
    return s;
  };
  while (!waiting.empty() || !running.empty() || in_flight.pending) {
    const auto t0 = std::chrono::steady_clock::now();
    Plan plan;
    bool drain = false;
    if (absl::Status s = Schedule(waiting, running, plan, &drain); !s.ok()) return fail(s);
    if (drain || plan.empty()) {  // the step in flight's tokens first
      if (!in_flight.pending) {
        if (drain || !running.empty() || !waiting.empty())
          return fail(absl::InternalError("rollout: nothing can run and nothing is in flight"));
        break;
      }
      if (absl::Status s = collect(); !s.ok()) return fail(s);
      continue;
    }
    Launched next;
    if (absl::Status s = Launch(plan, next); !s.ok()) return fail(s);
    if (absl::Status s = collect(); !s.ok()) return fail(s);
    in_flight = std::move(next);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    (plan.prompt_rows > 0 ? prefill_s_ : decode_s_) += dt;
    peak_blocks_ = std::max<int64_t>(peak_blocks_, cache_blocks_ - static_cast<int64_t>(free_blocks_.size()));
  }
  std::vector<Completion> out;
  for (auto& s : all) out.push_back(std::move(s->out));
  peak_bytes_ = model_->backend().allocator()->stats().peak_bytes;
  return out;
}

void RolloutEngine::FreeBlocks(Seq& s) {
  for (auto b = s.blocks.rbegin(); b != s.blocks.rend(); ++b)
    if (--block_refs_[*b] == 0) free_blocks_.push_back(*b);
  s.blocks.clear();
}

bool RolloutEngine::TakeBlock(Seq& s) {
  if (free_blocks_.empty()) return false;
  s.blocks.push_back(free_blocks_.back());
  block_refs_[free_blocks_.back()] = 1;
  free_blocks_.pop_back();
  return true;
}

// Recompute: the blocks go back, the tokens stay, and the sample is prefilled again (all of
// its known tokens) when it is admitted next, ahead of the samples that never ran.
void RolloutEngine::Preempt(Seq& s, std::deque<Seq*>& waiting) {
  FreeBlocks(s);
  s.computed = 0, s.leader = nullptr;
  waiting.push_front(&s);
  ++preemptions_;
}

absl::Status RolloutEngine::Schedule(std::deque<Seq*>& waiting, std::vector<Seq*>& running, Plan& plan, bool* drain) {
  const int64_t bs = options_.block_size;
  const int64_t watermark = std::max<int64_t>(1, cache_blocks_ / 100);
  int64_t budget = options_.max_prefill_tokens;
  bool in_flight = false;
  for (Seq* s : running) in_flight = in_flight || s->inflight > 0;
  // Blocks for positions [0, end) of s; when none is left, the latest admitted running
  // sample is preempted (s itself, maybe: then false). Needs the step in flight collected
  // first when it holds a token of anyone.
  auto ensure = [&](Seq& s, int64_t end) -> absl::StatusOr<bool> {
    while (static_cast<int64_t>(s.blocks.size()) * bs < end) {
      if (TakeBlock(s)) continue;
      if (in_flight) return *drain = true, false;
      auto victim = std::max_element(running.begin(), running.end(), [](Seq* a, Seq* b) { return a->admitted < b->admitted; });
      if (victim == running.end()) return absl::InternalError("rollout: no block and no sample to preempt");
      Seq* v = *victim;
      std::vector<Seq*> out = {v};  // with it, the samples waiting for its prompt
      for (Seq* f : running)
        if (f->leader == v && f->Known() == f->prompt_len && f->computed == 0) out.push_back(f);
      for (Seq* q : out) {
        running.erase(std::find(running.begin(), running.end(), q));
        Preempt(*q, waiting);
      }
      if (v == &s) return false;
    }
    return true;
  };
  // 1. The running samples: the next chunk of a prompt being prefilled (rows that attend
  // to the cache), or a decode row.
  for (size_t i = 0; i < running.size(); ++i) {
    Seq* s = running[i];
    if (s->leader != nullptr && s->computed == 0) continue;  // its prompt comes with its leader's
    const int64_t known = s->Known();
    int64_t first = s->computed, n = 1;
    if (s->computed < s->prefill_end) {
      n = std::min(budget, s->prefill_end - s->computed);
      if (n < 1) continue;
    } else if (s->computed != known - 1 || s->inflight > 1 || s->Generated() >= s->params->max_new_tokens) {
      continue;  // its last token is in flight
    }
    TESSERA_ASSIGN_OR_RETURN(const bool ok, ensure(*s, first + n));
    if (*drain) return absl::OkStatus();
    if (!ok) {  // s itself was preempted: running shrank
      --i;
      continue;
    }
    plan.paged.push_back({s, first, n});
    if (first < s->prefill_end) budget -= n, plan.prompt_rows += n;
    else ++plan.decode_rows;
  }
  // 2. Admission while a batch slot, the prompt budget and the cache allow: prompts of
  // waiting samples (a preempted one: all its tokens), fresh rows.
  std::map<int64_t, Seq*> leaders;  // this step's sample that starts each request's prompt
  while (!waiting.empty() && static_cast<int64_t>(running.size()) < options_.max_running) {
    Seq* s = waiting.front();
    const int64_t known = s->Known();
    const auto led = options_.prefix_sharing && known == s->prompt_len ? leaders.find(s->request) : leaders.end();
    if (led != leaders.end()) {  // shares the leader's full prompt blocks; a copy of the partial one
      Seq* l = led->second;
      const int64_t shared = s->prompt_len / bs, own = (s->prompt_len % bs) != 0 ? 1 : 0;
      if (static_cast<int64_t>(free_blocks_.size()) < own + watermark) break;
      waiting.pop_front();
      s->leader = l, s->prefill_end = s->prompt_len;
      for (int64_t k = 0; k < shared; ++k) s->blocks.push_back(l->blocks[k]), ++block_refs_[l->blocks[k]];
      if (own > 0) TakeBlock(*s);
      s->admitted = admitted_++;
      running.push_back(s);
      continue;
    }
    if (budget == 0) break;  // (followers above compute nothing)
    const int64_t need = (known + bs - 1) / bs;
    if (static_cast<int64_t>(free_blocks_.size()) < need + watermark && !(running.empty() && plan.empty())) break;
    if (static_cast<int64_t>(free_blocks_.size()) < need) break;  // cannot happen alone: every request fits the cache
    waiting.pop_front();
    for (int64_t k = 0; k < need; ++k) TakeBlock(*s);
    s->admitted = admitted_++;
    s->leader = nullptr, s->prefill_end = known;
    running.push_back(s);
    const int64_t n = std::min(budget, known);
    plan.fresh.push_back({s, 0, n});
    budget -= n, plan.prompt_rows += n;
    if (known == s->prompt_len) leaders[s->request] = s;  // (its prompt in chunks, maybe: they wait for the last)
  }
  // 3. Row order (fresh, then paged), the samples each row's logits give, followers' copies.
  int64_t row = 0;
  std::map<const Seq*, int64_t> last_row;
  auto place = [&](std::vector<Plan::Rows>& rows) {
    for (Plan::Rows& r : rows) {
      Seq& s = *r.seq;
      row += r.count;
      s.computed = r.first + r.count;
      if (s.computed == s.Known()) {  // its last known token: it draws the next
        plan.sampled.push_back(&s), plan.sample_of.push_back(row - 1);
        last_row[&s] = row - 1;
      }
    }
  };
  place(plan.fresh);
  place(plan.paged);
  for (Seq* f : running) {  // followers whose leader computes its prompt's last token now
    if (f->leader == nullptr || f->computed != 0) continue;
    const auto l = last_row.find(f->leader);
    if (l == last_row.end()) continue;
    f->computed = f->prompt_len;
    plan.sampled.push_back(f), plan.sample_of.push_back(l->second);
    for (int64_t p = f->prompt_len / bs * bs; p < f->prompt_len; ++p)
      plan.copy_from.push_back(f->leader->Slot(p, bs)), plan.copy_to.push_back(f->Slot(p, bs));
  }
  return absl::OkStatus();
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
  runtime::Backend& be = model_->backend();
  TESSERA_ASSIGN_OR_RETURN(gen_, model::Generator::Create(model_, blocks + scratch, bs));
  if (scratch > 0) TESSERA_RETURN_IF_ERROR(gen_->ReserveDecodeRows(pad_rows));  // before any capture
  // The step's tokens and their log-probs in one buffer: one download a step.
  TESSERA_ASSIGN_OR_RETURN(step_out_, be.Empty({pad_rows * 8}, DType::kU8));
  TESSERA_ASSIGN_OR_RETURN(step_tokens_, step_out_.View(DType::kI32, {pad_rows}, 0));
  TESSERA_ASSIGN_OR_RETURN(step_logprobs_, step_out_.View(DType::kF32, {pad_rows}, static_cast<size_t>(pad_rows) * 4));
  for (int i = 0; i < 2; ++i) {
    if (host_out_[i] == nullptr || landed_[i] == nullptr) {
      TESSERA_ASSIGN_OR_RETURN(host_out_[i], be.AllocHostStaging(static_cast<size_t>(pad_rows) * 8));
      TESSERA_ASSIGN_OR_RETURN(landed_[i], be.NewEvent());
    }
  }
  cache_blocks_ = blocks;
  scratch_block_ = scratch > 0 ? blocks : -1;
  free_blocks_.clear();
  for (int64_t b = blocks - 1; b >= 0; --b) free_blocks_.push_back(static_cast<int32_t>(b));
  block_refs_.assign(static_cast<size_t>(blocks), 0);
  return absl::OkStatus();
}

}  // namespace tessera::engine
