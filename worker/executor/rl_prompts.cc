#include "worker/executor/rl_prompts.h"

#include <algorithm>
#include <atomic>
#include <chrono>


#include "absl/strings/str_cat.h"
#include "common/rl.h"
#include "common/rpc/grpc_util.h"
#include "common/status.h"
#include "common/util.h"
#include "worker/executor/environment_client.h"
#include "worker/executor/model_spec.h"

namespace tessera::executor {

absl::Status RlPrompts::Load(const v1::JobSpec& spec, int64_t model_vocab) {
  const auto& t = spec.train();
  const v1::RlSpec& rl = spec.rl();
  data_ = {t.data().digits(), t.seed(), spec.model().seq_len(), /*answer_only=*/false};
  longest_ = 2 * t.data().digits() + 2;  // "a+b="
  text_.tokenizer = tokenizer::MakeByteTokenizer();
  if (t.data().kind() == "jsonl") {  // prompts through the model's tokenizer (bytes by default)
    TESSERA_ASSIGN_OR_RETURN(text_, ModelTextFromSpec(spec.model(), model_vocab));
    TESSERA_ASSIGN_OR_RETURN(file_, Encode(t.data().path()));
    shuffle_ = t.data().shuffle(), seed_ = t.seed(), order_pass_ = -1;
    if (!rl.eval_data().empty()) {
      TESSERA_ASSIGN_OR_RETURN(held_, Encode(rl.eval_data()));
    }
    longest_ = 0;
    for (const std::vector<Prompt>* set : {&file_, &held_})
      for (const Prompt& p : *set) longest_ = std::max<int64_t>(longest_, static_cast<int64_t>(p.ids.size()));
    stops_ = text_.eos_ids;
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> stops,
                           tokenizer::StopTokens(*text_.tokenizer, {rl.stop().begin(), rl.stop().end()}, "rl.stop"));
  stops_.insert(stops_.end(), stops.begin(), stops.end());
  multi_turn_ = {};
  if (!rl.environment().empty()) {
    multi_turn_.max_turns = rl.max_turns();
    TESSERA_ASSIGN_OR_RETURN(multi_turn_.tool_stop, text_.tokenizer->Encode(rl.tool_stop(), /*add_special=*/false));
    for (int32_t t : multi_turn_.tool_stop)
      if (t >= model_vocab)
        return absl::InvalidArgumentError(absl::StrCat("rl.tool_stop: token ", t, " is outside the model's vocabulary (", model_vocab, ")"));
  }
  return absl::OkStatus();
}

std::string RlPrompts::RawText(const std::vector<int32_t>& tokens, size_t begin) const {
  std::vector<int32_t> known;
  for (size_t i = begin; i < tokens.size(); ++i)
    if (tokens[i] >= 0 && tokens[i] < text_.tokenizer->vocab_size()) known.push_back(tokens[i]);
  auto text = text_.tokenizer->Decode(known, /*skip_special=*/false);
  return text.ok() ? *text : std::string();
}

absl::StatusOr<std::vector<int32_t>> RlPrompts::EncodeText(const std::string& text) const {
  return text_.tokenizer->Encode(text, /*add_special=*/false);
}

double RlPrompts::Reward(const engine::Completion& c, const std::string& answer) const {
  const size_t begin = engine::LastTurnBegin(c);
  return Reward(CompletionText(std::vector<int32_t>(c.tokens.begin() + static_cast<std::ptrdiff_t>(begin), c.tokens.end())), answer);
}

absl::StatusOr<std::vector<RlPrompts::Prompt>> RlPrompts::Encode(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<engine::PromptAnswer> lines, engine::LoadPromptAnswers(path));
  std::vector<Prompt> out(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(out[i].ids, engine::EncodePrompt(lines[i], path, text_, &out[i].text));
    out[i].answer = lines[i].answer;
  }
  return out;
}

namespace {
uint64_t SplitMix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

std::vector<uint32_t> ShuffledOrder(size_t n, uint64_t seed, int64_t pass) {
  std::vector<uint32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
  uint64_t state = seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(pass) + 1;
  for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[SplitMix(state) % i]);  // Fisher-Yates
  return order;
}

RlPrompts::Prompt RlPrompts::At(int64_t index) const {
  if (!file_.empty()) {
    const int64_t n = static_cast<int64_t>(file_.size()), pass = index / n;
    size_t line = static_cast<size_t>(index % n);
    if (shuffle_) {
      std::lock_guard<std::mutex> lock(order_mu_);
      if (order_pass_ != pass) order_ = ShuffledOrder(file_.size(), seed_, pass), order_pass_ = pass;
      line = order_[line];
    }
    return file_[line];
  }
  Prompt p;
  const std::string problem = engine::ArithmeticProblem(data_, index);
  const size_t eq = problem.find('=') + 1;
  p.text = problem.substr(0, eq);
  p.answer = problem.substr(eq);
  for (unsigned char c : p.text) p.ids.push_back(c);  // bytes are tokens of the byte tokenizer
  return p;
}

std::string RlPrompts::CompletionText(const std::vector<int32_t>& tokens) const {
  std::vector<int32_t> known;
  for (int32_t t : tokens) if (t >= 0 && t < text_.tokenizer->vocab_size()) known.push_back(t);
  auto text = text_.tokenizer->Decode(known, /*skip_special=*/true);
  return text.ok() ? *text : std::string();
}

double RlPrompts::Reward(const std::string& completion_text, const std::string& answer) const {
  return !file_.empty() ? rl::ExactAnswerReward(completion_text, answer) : completion_text == answer ? 1.0 : 0.0;
}

absl::StatusOr<std::unique_ptr<RewardServiceClient>> RewardServiceClient::Create(const v1::JobSpec& spec,
                                                                                 comm::Communicator* tp,
                                                                                 runtime::Backend* backend) {
  if (spec.rl().reward_service().empty()) return std::unique_ptr<RewardServiceClient>();
  auto c = std::make_unique<RewardServiceClient>();
  c->rl_ = spec.rl(), c->job_ = spec.name(), c->tp_ = tp, c->backend_ = backend;
  if (tp == nullptr || tp->rank() == 0) {
    TESSERA_ASSIGN_OR_RETURN(auto channel, UserServiceChannel("rl.reward_service", c->rl_.reward_service(), c->rl_.reward_ca_cert()));
    c->stub_ = v1::RewardService::NewStub(channel);
  }
  return c;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> UserServiceChannel(const std::string& field, const std::string& address,
                                                                  const std::string& ca_cert) {
  ChannelOptions co;
  co.address = address;
  co.max_message_bytes = 256 << 20;
  if (!ca_cert.empty()) {
    TESSERA_ASSIGN_OR_RETURN(co.ca_pem, ReadFile(ca_cert));
  } else {
    co.insecure = true;  // refused by MakeChannel unless the address is loopback
  }
  auto channel = MakeChannel(co);
  if (!channel.ok()) return absl::Status(channel.status().code(), absl::StrCat(field, ": ", channel.status().message()));
  return *channel;
}

absl::StatusOr<std::vector<double>> RewardServiceClient::Score(int64_t step, int dp_rank, const std::vector<std::string>& prompts,
                                                              const std::vector<std::string>& answers,
                                                              const std::vector<engine::Completion>& completions,
                                                              const std::vector<std::string>& texts) {
  const size_t n = completions.size();
  std::vector<float> buf(n + 1, 0.f);  // [ok, rewards...]
  std::string error;
  if (stub_ != nullptr) {
    v1::ScoreRequest req;
    req.set_job(job_), req.set_step(step), req.set_dp_rank(dp_rank);
    for (size_t i = 0; i < n; ++i) {
      auto* s = req.add_samples();
      s->set_prompt(prompts[completions[i].request]);
      s->set_completion(texts[i]);
      s->set_reference(answers[completions[i].request]);
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(rl_.reward_timeout_s() * 1000)));
    v1::ScoreResponse resp;
    const grpc::Status st = stub_->Score(&ctx, req, &resp);
    if (!st.ok()) {
      const std::string why = st.error_code() == grpc::DEADLINE_EXCEEDED
                                  ? absl::StrCat("no answer within ", rl_.reward_timeout_s(), " s")
                                  : absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(st.error_code())),
                                                 st.error_message().empty() ? "" : ": ", st.error_message());
      error = absl::StrCat("rl.reward_service ", rl_.reward_service(), ": Score failed (", why, ")");
    } else if (static_cast<size_t>(resp.rewards_size()) != n) {
      error = absl::StrCat("rl.reward_service ", rl_.reward_service(), ": ", resp.rewards_size(), " rewards for ", n, " samples");
    } else {
      buf[0] = 1.f;
      for (size_t i = 0; i < n; ++i) buf[i + 1] = static_cast<float>(resp.rewards(static_cast<int>(i)));
    }
  }
  if (tp_ != nullptr && tp_->size() > 1) {  // TP rank 0's answer (or its failure) to its peers
    TESSERA_ASSIGN_OR_RETURN(runtime::Tensor t, backend_->Empty({static_cast<int64_t>(n + 1)}, tessera::DType::kF32));
    TESSERA_RETURN_IF_ERROR(backend_->CopyFromHost(buf.data(), t));
    TESSERA_RETURN_IF_ERROR(tp_->Broadcast(t.data(), n + 1, tessera::DType::kF32, 0));
    TESSERA_RETURN_IF_ERROR(tp_->Synchronize());
    TESSERA_RETURN_IF_ERROR(backend_->CopyToHost(t, buf.data()));
    if (buf[0] != 1.f && error.empty())  // ABORTED: TP rank 0 reports why (see WorkerGroup::CallEach)
      return absl::AbortedError("rl.reward_service: TP rank 0 got no rewards from the service");
  }
  if (!error.empty()) return absl::UnavailableError(error);
  return std::vector<double>(buf.begin() + 1, buf.end());
}

absl::StatusOr<v1::RlEvalResponse> HeldOutEval(engine::RolloutEngine& rollout, const RlPrompts& prompts, EnvironmentClient* env,
                                               int64_t max_new_tokens, int64_t problems, int dp_rank, int dps) {
  if (problems < 1 || problems > 1000000)
    return absl::InvalidArgumentError(absl::StrCat("RlEval: problems ", problems, "; expected 1..1000000"));
  // This rank's problems: rl.eval_data's (at most the file's), or the arithmetic held-out
  // split's ("a+b=" as bytes, the answer "c\n" matched exactly).
  const bool jsonl = prompts.jsonl();
  if (jsonl && prompts.held_out().empty())
    return absl::FailedPreconditionError("RlEval: a JSONL job's held-out problems come from rl.eval_data");
  const int64_t n = jsonl ? std::min<int64_t>(problems, static_cast<int64_t>(prompts.held_out().size())) : problems;
  const int64_t begin = n * dp_rank / dps, end = n * (dp_rank + 1) / dps;
  engine::ArithmeticData arithmetic = prompts.arithmetic();
  arithmetic.held_out = true;
  std::vector<engine::GenerationRequest> requests;
  std::vector<std::string> answers, texts;
  for (int64_t i = begin; i < end; ++i) {
    engine::GenerationRequest r;
    r.params.temperature = 0;  // greedy
    r.params.max_new_tokens = max_new_tokens;
    if (jsonl) {
      r.prompt = prompts.held_out()[i].ids;
      r.params.stop_tokens = prompts.stop_tokens();
      answers.push_back(prompts.held_out()[i].answer);
      texts.push_back(prompts.held_out()[i].text);
    } else {
      const std::string p = engine::ArithmeticProblem(arithmetic, i);
      const size_t eq = p.find('=') + 1;
      r.prompt.assign(p.begin(), p.begin() + eq);
      r.params.stop_tokens = {'\n'};
      answers.push_back(p.substr(eq));
      texts.push_back(p.substr(0, eq));
    }
    requests.push_back(std::move(r));
  }
  int64_t correct = 0, tool_calls = 0;
  if (!requests.empty()) {
    static std::atomic<int64_t> evals{0};  // names this executor's evaluations apart (sessions)
    const EpisodeRound round{"eval", evals++, 0, dp_rank, begin};
    TESSERA_ASSIGN_OR_RETURN(std::vector<engine::Completion> out, RunEpisodes(rollout, requests, prompts, env, round, texts, answers));
    for (const engine::Completion& c : out) {
      const std::string& answer = answers[c.request];
      const size_t from = engine::LastTurnBegin(c);
      tool_calls += c.tool_calls;
      correct += jsonl ? prompts.Reward(c, answer) >= 1.0
                       : std::string(c.tokens.begin() + static_cast<std::ptrdiff_t>(from), c.tokens.end()) == answer;
    }
  }
  v1::RlEvalResponse r;
  r.set_correct(correct), r.set_problems(end - begin), r.set_tool_calls(tool_calls);
  return r;
}

}  // namespace tessera::executor
