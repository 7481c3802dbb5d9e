#include "worker/executor/rollout_pool.h"

#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/rpc/tensor_stream.h"
#include "common/spec/job_spec.h"
#include "common/status.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/executor/model_spec.h"
#include "worker/executor/rl_batch.h"

namespace tessera::executor {

absl::StatusOr<std::unique_ptr<RolloutPoolSession>> RolloutPoolSession::Create(const v1::JobSpec& spec, GroupComms& comms,
                                                                              v1::DeviceType device, int device_index) {
  std::unique_ptr<RolloutPoolSession> s(new RolloutPoolSession());
  s->rl_ = spec.rl();
  s->actor_dps_ = std::max(1, spec.groups(0).layout().dp());
  TESSERA_ASSIGN_OR_RETURN(model::LlamaConfig config, ModelConfigFromSpec(spec, device));
  const runtime::Device dev = device == v1::DEVICE_TYPE_GPU ? runtime::Device::Cuda(device_index) : runtime::Device::Cpu();
  TESSERA_ASSIGN_OR_RETURN(s->backend_, runtime::MakeBackend(dev));
  auto comm_of = [&](parallel::GroupKind k) { return CommOf(comms, k); };
  comm::Communicator* tp = comm_of(parallel::GroupKind::kTp);
  comm::Communicator* dp = comm_of(parallel::GroupKind::kDp);
  s->dp_rank_ = dp != nullptr ? dp->rank() : 0;
  s->dps_ = comms.layout.dp;
  TESSERA_RETURN_IF_ERROR(OrderCommsWith(comms, device, s->backend_->stream()));
  TESSERA_ASSIGN_OR_RETURN(s->model_, model::Llama::Create(config, s->backend_.get(), tp));
  // Placeholder weights: the actor's arrive by the first sync, before any generation.
  TESSERA_RETURN_IF_ERROR(s->model_->InitRandom(spec.train().seed(), 0.02f));
  TESSERA_RETURN_IF_ERROR(s->prompts_.Load(spec, config.vocab));
  TESSERA_ASSIGN_OR_RETURN(s->rewards_, RewardServiceClient::Create(spec, tp, s->backend_.get()));
  TESSERA_ASSIGN_OR_RETURN(s->env_, EnvironmentClient::Create(spec, tp, s->backend_.get()));
  TESSERA_ASSIGN_OR_RETURN(s->rollout_, engine::RolloutEngine::Create(
                                            s->model_.get(), RlRolloutOptions(s->rl_, s->dps_, s->prompts_.longest_prompt())));
  const v1::GroupSpec* pool = RolloutPool(spec);
  s->colocated_ = pool != nullptr && !pool->colocate_with().empty();
  return s;
}

void RolloutPoolSession::ReleaseForOffload(std::vector<runtime::Tensor>* states) {
  rollout_->ReleaseCache();
  model_->AppendStates(states);
}

absl::StatusOr<v1::RolloutStats> RolloutPoolSession::Generate(int64_t step, int refill, v1::TensorBatch* out) {
  auto got = GenerateSamples(*rollout_, prompts_, rl_, rewards_.get(), env_.get(), step, refill, dp_rank_, dps_, actor_dps_, out);
  if (colocated_) rollout_->ReleaseCache();
  return got;
}

engine::RolloutOptions RlRolloutOptions(const v1::RlSpec& rl, int dps, int64_t longest_prompt) {
  engine::RolloutOptions ro;
  const int64_t per_rank = int64_t(rl.prompts_per_step() / dps) * rl.group_size();
  ro.max_running = std::max<int64_t>(1, std::min<int64_t>(per_rank, 1024));
  ro.block_size = 16;
  const int64_t longest = longest_prompt + rl.max_new_tokens();  // a prompt and its completion
  ro.num_blocks = ro.max_running * ((longest + ro.block_size - 1) / ro.block_size);
  ro.gpu_memory_utilization = rl.gpu_memory_utilization();
  return ro;
}

int64_t RefillPromptIndex(const v1::RlSpec& rl, int64_t step, int refill) {
  return (int64_t{1} << 40) + (step * std::max(rl.max_gen_batches(), 1) + refill - 1) * rl.prompts_per_step();
}

absl::StatusOr<v1::RolloutStats> GenerateSamples(engine::RolloutEngine& rollout, const RlPrompts& prompts_,
                                                 const v1::RlSpec& rl_, RewardServiceClient* rewards_, EnvironmentClient* env,
                                                 int64_t step, int refill, int dp_rank_, int dps_, int actor_dps_,
                                                 v1::TensorBatch* out) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("RolloutGenerate: step ", step));
  if (refill < 0 || (refill > 0 && (!rl_.filter_groups() || refill >= rl_.max_gen_batches())))
    return absl::InvalidArgumentError(absl::StrCat("RolloutGenerate: refill ", refill, " of step ", step, " (rl.filter_groups ",
                                                   rl_.filter_groups() ? "on" : "off", ", rl.max_gen_batches ",
                                                   rl_.max_gen_batches(), ")"));
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t P = rl_.prompts_per_step(), per = P / dps_, actor_per = P / actor_dps_;
  const int64_t first = refill == 0 ? step * P : RefillPromptIndex(rl_, step, refill);
  // A refill's sampling seeds: another stream per refill (refill 0 keeps the step's).
  const uint64_t salt = static_cast<uint64_t>(refill) * 0x9e3779b97f4a7c15ull;
  std::vector<engine::GenerationRequest> requests;
  std::vector<std::string> answers, texts;
  for (int64_t i = 0; i < per; ++i) {
    const int64_t g = dp_rank_ * per + i;  // the prompt's place in the step
    RlPrompts::Prompt p = prompts_.At(first + g);
    engine::GenerationRequest r;
    r.prompt = std::move(p.ids);
    r.params.temperature = static_cast<float>(rl_.temperature());
    r.params.max_new_tokens = rl_.max_new_tokens();
    r.params.stop_tokens = prompts_.stop_tokens();
    r.params.n = rl_.group_size();
    // The seed the actor's DP rank g / actor_per gives its prompt g % actor_per colocated
    // (GenerateSamples on the actor: step * 1009 + its DP rank, then engine::PromptSeed).
    r.params.seed = engine::PromptSeed((static_cast<uint64_t>(step) * 1009 + g / actor_per) ^ salt, static_cast<size_t>(g % actor_per));
    requests.push_back(std::move(r));
    answers.push_back(std::move(p.answer));
    texts.push_back(std::move(p.text));
  }
  if (env != nullptr) env->ResetSeconds();
  engine::EpisodeStats engine_stats;  // over every round of a multi-turn generation
  TESSERA_ASSIGN_OR_RETURN(std::vector<engine::Completion> done,
                           RunEpisodes(rollout, requests, prompts_, env, {"train", step, refill, dp_rank_, dp_rank_ * per},
                                       texts, answers, &engine_stats));
  const double generate_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<std::vector<int32_t>> prompts, completions;
  std::vector<std::vector<float>> logprobs;
  std::vector<std::vector<uint8_t>> sampled;
  std::vector<std::string> said;  // the completions' text
  for (const engine::Completion& c : done) said.push_back(prompts_.CompletionText(c.tokens));
  std::vector<double> rewards;
  if (rewards_ != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(rewards, rewards_->Score(step, dp_rank_, texts, answers, done, said));
  } else {
    for (size_t i = 0; i < done.size(); ++i) rewards.push_back(prompts_.Reward(done[i], answers[done[i].request]));
  }
  double reward = 0, length = 0, tool_calls = 0;
  for (size_t i = 0; i < done.size(); ++i) {
    const engine::Completion& c = done[i];
    if (!std::isfinite(rewards[i])) return absl::InvalidArgumentError(absl::StrCat("grpo: reward ", i, " is not finite"));
    prompts.push_back(requests[c.request].prompt);
    completions.push_back(c.tokens);
    logprobs.push_back(c.logprobs);
    sampled.push_back(c.sampled);
    reward += rewards[i] / done.size(), length += double(c.tokens.size()) / done.size();
    tool_calls += double(c.tool_calls) / done.size();
  }
  // A multi-turn job's batches all carry completion_mask, so that every rank's and every
  // generation's have the same tensors (the driver concatenates them).
  *out = SamplesToBatch(prompts, completions, rewards, static_cast<size_t>(prompts_.longest_prompt()),
                        static_cast<size_t>(rl_.max_new_tokens()), &logprobs, env != nullptr ? &sampled : nullptr);
  v1::RolloutStats st;
  st.set_tool_calls(tool_calls);
  if (env != nullptr) st.set_environment_s(env->seconds());
  st.set_reward(reward), st.set_response_length(length), st.set_samples(static_cast<int64_t>(done.size()));
  st.set_generate_s(generate_s);
  st.set_prefill_s(engine_stats.prefill_s), st.set_decode_s(engine_stats.decode_s);
  st.set_decode_steps(engine_stats.decode_steps), st.set_graph_steps(engine_stats.graph_steps);
  st.set_memory_peak_bytes(engine_stats.peak_bytes), st.set_kv_cache_bytes(rollout.cache_bytes());
  int64_t prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += static_cast<int64_t>(p.size());
  st.set_prompt_tokens(prompt_tokens);
  return st;
}

absl::StatusOr<v1::RlEvalResponse> RolloutPoolSession::Eval(int64_t problems) {
  auto got = HeldOutEval(*rollout_, prompts_, env_.get(), rl_.max_new_tokens(), problems, dp_rank_, dps_);
  if (colocated_) rollout_->ReleaseCache();
  return got;
}

namespace {

void AddI32(v1::TensorBatch* b, const std::string& name, std::vector<int64_t> shape, const std::vector<int32_t>& v) {
  auto* t = b->add_tensors();
  t->set_name(name), t->set_dtype(v1::DTYPE_I32);
  for (int64_t d : shape) t->add_shape(d);
  t->set_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t)));
}

// A padded [N, L] matrix of rows and their lengths.
void AddRows(v1::TensorBatch* b, const std::string& name, const std::vector<std::vector<int32_t>>& rows, size_t width) {
  for (const auto& r : rows) width = std::max(width, r.size());
  std::vector<int32_t> flat(rows.size() * width, 0), lens;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy(rows[i].begin(), rows[i].end(), flat.begin() + i * width);
    lens.push_back(static_cast<int32_t>(rows[i].size()));
  }
  AddI32(b, name, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(width)}, flat);
  AddI32(b, name + "_len", {static_cast<int64_t>(rows.size())}, lens);
}

const v1::NamedTensor* Find(const v1::TensorBatch& b, const std::string& name) {
  for (const auto& t : b.tensors()) if (t.name() == name) return &t;
  return nullptr;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> GetRows(const v1::TensorBatch& b, const std::string& name) {
  const v1::NamedTensor* m = Find(b, name);
  const v1::NamedTensor* l = Find(b, name + "_len");
  if (m == nullptr || l == nullptr || m->dtype() != v1::DTYPE_I32 || l->dtype() != v1::DTYPE_I32 || m->shape_size() != 2 ||
      l->shape_size() != 1 || l->shape(0) != m->shape(0) ||
      m->data().size() != static_cast<size_t>(m->shape(0) * m->shape(1)) * sizeof(int32_t) ||
      l->data().size() != static_cast<size_t>(l->shape(0)) * sizeof(int32_t))
    return absl::InvalidArgumentError(absl::StrCat("samples batch: expected ", name, " [N, L] and ", name,
                                                   "_len [N] of i32 with matching sizes"));
  const int64_t n = m->shape(0), width = m->shape(1);
  std::vector<int32_t> flat(n * width), lens(n);
  std::memcpy(flat.data(), m->data().data(), m->data().size());
  std::memcpy(lens.data(), l->data().data(), l->data().size());
  std::vector<std::vector<int32_t>> rows(n);
  for (int64_t i = 0; i < n; ++i) {
    if (lens[i] < 0 || lens[i] > width) return absl::InvalidArgumentError(absl::StrCat("samples batch: ", name, "_len[", i, "] = ", lens[i]));
    rows[i].assign(flat.begin() + i * width, flat.begin() + i * width + lens[i]);
  }
  return rows;
}

}  // namespace

v1::TensorBatch SamplesToBatch(const std::vector<std::vector<int32_t>>& prompts,
                               const std::vector<std::vector<int32_t>>& completions, const std::vector<double>& rewards,
                               size_t prompt_width, size_t completion_width,
                               const std::vector<std::vector<float>>* logprobs,
                               const std::vector<std::vector<uint8_t>>* sampled) {
  v1::TensorBatch b;
  AddRows(&b, "prompt", prompts, prompt_width);
  AddRows(&b, "completion", completions, completion_width);
  *b.add_tensors() = F32Tensor("reward", {static_cast<int64_t>(rewards.size())}, std::vector<float>(rewards.begin(), rewards.end()));
  size_t width = completion_width;
  for (const auto& c : completions) width = std::max(width, c.size());
  auto is_sampled = [&](size_t i, size_t j) {
    return sampled == nullptr || (*sampled)[i].empty() || (j < (*sampled)[i].size() && (*sampled)[i][j] != 0);
  };
  if (sampled != nullptr) {  // 1: a model token, 0: an observation (and padding)
    std::vector<int32_t> mask(completions.size() * width, 0);
    for (size_t i = 0; i < completions.size(); ++i)
      for (size_t j = 0; j < completions[i].size(); ++j) mask[i * width + j] = is_sampled(i, j) ? 1 : 0;
    AddI32(&b, kCompletionMask, {static_cast<int64_t>(completions.size()), static_cast<int64_t>(width)}, mask);
  }
  if (logprobs != nullptr) {  // at the sampled tokens, in order (a token tensor: rl_batch.h)
    std::vector<float> flat(logprobs->size() * width, 0.0f);
    for (size_t i = 0; i < logprobs->size(); ++i) {
      size_t k = 0;
      for (size_t j = 0; j < (*logprobs)[i].size() && k < width; ++j)
        if (is_sampled(i, j)) flat[i * width + k++] = (*logprobs)[i][j];
    }
    *b.add_tensors() = F32Tensor(kRolloutLogp, {static_cast<int64_t>(logprobs->size()), static_cast<int64_t>(width)}, flat);
  }
  return b;
}

absl::Status BatchToSamples(const v1::TensorBatch& batch, std::vector<std::vector<int32_t>>* prompts,
                            std::vector<std::vector<int32_t>>* completions, std::vector<double>* rewards,
                            std::vector<std::vector<uint8_t>>* sampled) {
  TESSERA_ASSIGN_OR_RETURN(*prompts, GetRows(batch, "prompt"));
  TESSERA_ASSIGN_OR_RETURN(*completions, GetRows(batch, "completion"));
  if (sampled != nullptr) {
    sampled->assign(completions->size(), {});
    if (const v1::NamedTensor* m = Find(batch, kCompletionMask); m != nullptr) {
      const int64_t n = static_cast<int64_t>(completions->size());
      if (m->dtype() != v1::DTYPE_I32 || m->shape_size() != 2 || m->shape(0) != n ||
          m->data().size() != static_cast<size_t>(n * m->shape(1)) * sizeof(int32_t))
        return absl::InvalidArgumentError(absl::StrCat("samples batch: expected ", kCompletionMask, " [", n, ", W] i32"));
      const int64_t width = m->shape(1);
      std::vector<int32_t> flat(static_cast<size_t>(n * width));
      if (!flat.empty()) std::memcpy(flat.data(), m->data().data(), m->data().size());
      for (int64_t i = 0; i < n; ++i) {
        const size_t len = (*completions)[i].size();
        if (static_cast<int64_t>(len) > width)
          return absl::InvalidArgumentError(absl::StrCat("samples batch: ", kCompletionMask, " is ", width, " wide; completion ",
                                                         i, " has ", len, " tokens"));
        for (size_t j = 0; j < len; ++j) (*sampled)[i].push_back(flat[i * width + j] != 0 ? 1 : 0);
      }
    }
  }
  const v1::NamedTensor* r = Find(batch, "reward");
  if (r == nullptr || r->dtype() != v1::DTYPE_F32 || r->shape_size() != 1 || r->shape(0) != static_cast<int64_t>(prompts->size()) ||
      completions->size() != prompts->size() || r->data().size() != prompts->size() * sizeof(float))
    return absl::InvalidArgumentError("samples batch: expected reward [N] f32 with as many rows as prompt and completion");
  std::vector<float> v(prompts->size());
  std::memcpy(v.data(), r->data().data(), r->data().size());
  rewards->assign(v.begin(), v.end());
  return absl::OkStatus();
}

absl::StatusOr<std::string> WeightsDigest(model::Llama& model) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  absl::Status st;
  for (model::Param& p : model.params()) {
    auto whole = model.GatherGlobal(p, /*grad=*/false);
    if (!whole.ok()) { st = whole.status(); break; }
    EVP_DigestUpdate(ctx, p.name().data(), p.name().size());
    EVP_DigestUpdate(ctx, whole->data(), whole->size() * sizeof(float));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  TESSERA_RETURN_IF_ERROR(st);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) absl::StrAppend(&hex, absl::Hex(md[i], absl::kZeroPad2));
  return hex;
}

absl::StatusOr<std::unique_ptr<comm::Communicator>> MakeBridge(const v1::ExecutorConfig& cfg, comm::KvStore* rdv,
                                                                const std::string& listen_host) {
  const v1::JobSpec& spec = cfg.spec();
  const v1::GroupSpec* pool = RolloutPool(spec);
  if (pool == nullptr) return absl::FailedPreconditionError("BridgeInit: the job has no rollout pool of its own");
  const v1::GroupSpec& actor = spec.groups(0);
  int rank = -1;
  for (const auto& gr : cfg.ranks()) {
    if (gr.group() == actor.name()) rank = gr.rank();
    if (gr.group() == pool->name()) rank = actor.devices() + gr.rank();
  }
  if (rank < 0) return absl::FailedPreconditionError("BridgeInit: this executor hosts neither the actor nor the rollout pool");
  const int size = actor.devices() + pool->devices();
  if (cfg.device_type() == v1::DEVICE_TYPE_GPU) {
    comm::NcclOptions o;
    o.device = cfg.device_index();
    o.timeout_ms = spec.collective_timeout_ms();
    return comm::MakeNcclCommunicator("bridge", "bridge", rank, size, rdv, o);
  }
  comm::GlooOptions o;
  o.listen_host = listen_host;
  o.timeout_ms = spec.collective_timeout_ms();
  return comm::MakeGlooCommunicator("bridge", "bridge", rank, size, rdv, o);
}

}  // namespace tessera::executor
