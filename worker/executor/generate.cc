#include "worker/executor/generate.h"

#include <unistd.h>

#include <chrono>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/util.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/checkpoint/hf.h"
#include "worker/executor/model_spec.h"

namespace tessera::executor {
using json = nlohmann::json;

absl::StatusOr<std::unique_ptr<GenerateSession>> GenerateSession::Create(const v1::JobSpec& spec, GroupComms& comms,
                                                                         v1::DeviceType device, int device_index) {
  std::unique_ptr<GenerateSession> s(new GenerateSession());
  s->g_ = spec.generate();
  TESSERA_ASSIGN_OR_RETURN(model::LlamaConfig config, ModelConfigFromSpec(spec, device));
  const runtime::Device dev = device == v1::DEVICE_TYPE_GPU ? runtime::Device::Cuda(device_index) : runtime::Device::Cpu();
  TESSERA_ASSIGN_OR_RETURN(s->backend_, runtime::MakeBackend(dev));
  auto comm_of = [&](parallel::GroupKind k) { return CommOf(comms, k); };
  s->tp_ = comm_of(parallel::GroupKind::kTp);
  s->dp_ = comm_of(parallel::GroupKind::kDp);
  s->dp_rank_ = s->dp_ != nullptr ? s->dp_->rank() : 0;
  s->dps_ = comms.layout.dp;
  TESSERA_RETURN_IF_ERROR(OrderCommsWith(comms, device, s->backend_->stream()));
  TESSERA_ASSIGN_OR_RETURN(s->model_, model::Llama::Create(config, s->backend_.get(), s->tp_));
  if (!spec.model().hf_dir().empty()) {
    TESSERA_RETURN_IF_ERROR(checkpoint::ImportHf(spec.model().hf_dir(), *s->model_));
  } else {
    std::string from = s->g_.checkpoint();
    if (!ReadFile(from + "/metadata.json").ok()) {  // a checkpoint directory: its latest step
      auto latest = checkpoint::LatestCheckpoint(from);
      if (!latest.ok())
        return absl::NotFoundError(absl::StrCat("generate.checkpoint: ", latest.status().message()));
      from = *latest;
    }
    TESSERA_RETURN_IF_ERROR(checkpoint::LoadCheckpoint(from, {s->model_.get(), nullptr, s->tp_, s->dp_, nullptr}).status());
  }
  TESSERA_RETURN_IF_ERROR(s->LoadText(spec, config.vocab));
  return s;
}

absl::Status GenerateSession::LoadText(const v1::JobSpec& spec, int64_t model_vocab) {
  TESSERA_ASSIGN_OR_RETURN(text_, ModelTextFromSpec(spec.model(), model_vocab));
  TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> stops,
                           tokenizer::StopTokens(*text_.tokenizer, {g_.stop().begin(), g_.stop().end()}, "generate.stop"));
  stop_ids_ = text_.eos_ids;
  stop_ids_.insert(stop_ids_.end(), stops.begin(), stops.end());
  return absl::OkStatus();
}

// The prompt's tokens of one input line; INVALID_ARGUMENT (without the line's place) when
// it has neither a "prompt" string nor a "messages" list the chat template takes.
absl::StatusOr<std::vector<int32_t>> GenerateSession::PromptOf(const json& j) const {
  if (j.contains("prompt") && j["prompt"].is_string() && !j["prompt"].get<std::string>().empty())
    return text_.tokenizer->Encode(j["prompt"].get<std::string>(), /*add_special=*/true);
  if (!j.contains("messages"))
    return absl::InvalidArgumentError("expected {\"prompt\": \"non-empty string\", ...} or {\"messages\": [...], ...}");
  if (!text_.chat) return absl::InvalidArgumentError(absl::StrCat("\"messages\" needs a chat template: ", text_.chat_status.message()));
  // Ordered: tojson in templates keeps the keys' order.
  const auto messages = nlohmann::ordered_json::parse(j["messages"].dump());
  TESSERA_ASSIGN_OR_RETURN(std::string prompt, text_.chat->Apply(messages, /*add_generation_prompt=*/true));
  return text_.tokenizer->Encode(prompt, /*add_special=*/false);  // the template wrote BOS if the model wants one
}

absl::StatusOr<v1::GenerateResponse> GenerateSession::Run() {
  const auto t0 = std::chrono::steady_clock::now();
  std::ifstream in(g_.input());
  if (!in) return absl::NotFoundError(absl::StrCat("generate.input: cannot read ", g_.input()));
  // Every rank reads the whole file (the line numbers name errors) and keeps its share.
  std::vector<json> lines;
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  for (int64_t no = 1; std::getline(in, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return absl::InvalidArgumentError(absl::StrCat(g_.input(), ":", no, ": expected {\"prompt\": \"non-empty string\", ...}"));
    // Every line is checked on every rank, so that a bad line fails the job wherever it is.
    auto prompt = PromptOf(j);
    if (!prompt.ok()) return absl::InvalidArgumentError(absl::StrCat(g_.input(), ":", no, ": ", prompt.status().message()));
    if (prompt->empty()) return absl::InvalidArgumentError(absl::StrCat(g_.input(), ":", no, ": the prompt has no tokens"));
    lines.push_back(std::move(j));
    prompts.push_back(std::move(*prompt));
  }
  if (lines.empty()) return absl::InvalidArgumentError(absl::StrCat(g_.input(), ": no prompts"));
  const int64_t total = static_cast<int64_t>(lines.size());
  const int64_t begin = total * dp_rank_ / dps_, end = total * (dp_rank_ + 1) / dps_;
  std::vector<engine::GenerationRequest> reqs;
  int64_t longest = 1, longest_line = begin;
  for (int64_t i = begin; i < end; ++i) {
    engine::GenerationRequest r;
    r.prompt = std::move(prompts[i]);
    r.params.n = g_.n(), r.params.max_new_tokens = g_.max_new_tokens();
    r.params.temperature = static_cast<float>(g_.has_temperature() ? g_.temperature() : text_.temperature.value_or(1));
    r.params.top_k = g_.has_top_k() ? g_.top_k() : text_.top_k.value_or(0);
    r.params.top_p = static_cast<float>(g_.has_top_p() ? g_.top_p() : text_.top_p.value_or(1));
    r.params.seed = g_.seed() + static_cast<uint64_t>(i) * 7919u;  // by global line: any DP split draws the same
    r.params.stop_tokens = stop_ids_;
    if (static_cast<int64_t>(r.prompt.size()) > longest) longest = static_cast<int64_t>(r.prompt.size()), longest_line = i;
    reqs.push_back(std::move(r));
  }
  int64_t completions = 0, tokens = 0;
  std::string part;
  if (!reqs.empty()) {
    engine::RolloutOptions o;
    o.block_size = 16;
    o.max_running = g_.max_running();
    const int64_t per_seq = longest + g_.max_new_tokens();
    const int64_t cache_tokens = g_.cache_tokens() > 0 ? g_.cache_tokens() : o.max_running * per_seq;
    if (cache_tokens < per_seq)  // the only request the engine could refuse: bytes are always tokens
      return absl::InvalidArgumentError(absl::StrCat("generate.cache_tokens: ", cache_tokens, " tokens cannot hold prompt ",
                                                     longest_line + 1, " of ", g_.input(), " (", longest,
                                                     " tokens) + max_new_tokens (", g_.max_new_tokens(), ")"));
    o.num_blocks = (cache_tokens + o.block_size - 1) / o.block_size;
    TESSERA_ASSIGN_OR_RETURN(auto engine, engine::RolloutEngine::Create(model_.get(), o));
    TESSERA_ASSIGN_OR_RETURN(std::vector<engine::Completion> got, engine->Generate(reqs));
    std::vector<json> outs(reqs.size());
    for (json& o : outs) o = json::array();
    for (const engine::Completion& c : got) {
      double logprob = 0;
      for (float l : c.logprobs) logprob += l;
      std::vector<int32_t> known;  // a model's vocabulary may be padded past the tokenizer's: those ids have no text
      for (int32_t t : c.tokens) if (t < text_.tokenizer->vocab_size()) known.push_back(t);
      TESSERA_ASSIGN_OR_RETURN(std::string text, text_.tokenizer->Decode(known, /*skip_special=*/true));
      outs[c.request].push_back({{"text", std::move(text)},
                                 {"token_ids", c.tokens},  // lossless: the text is UTF-8 with U+FFFD for bytes that are not
                                 {"finish_reason", c.finish_reason},
                                 {"num_tokens", c.tokens.size()},
                                 {"cumulative_logprob", logprob}});
      ++completions, tokens += static_cast<int64_t>(c.tokens.size());
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      json o = lines[begin + i];
      o["completions"] = std::move(outs[i]);
      absl::StrAppend(&part, o.dump(-1, ' ', false, json::error_handler_t::replace), "\n");  // bytes that are not UTF-8: U+FFFD
    }
  }
  // TP rank 0 of each DP rank writes its part; after every rank has, DP rank 0 joins them.
  const bool writer = tp_ == nullptr || tp_->rank() == 0;
  const std::string part_path = absl::StrCat(g_.output(), ".part-", dp_rank_);
  absl::Status wrote = writer ? WriteFileAtomic(part_path, part) : absl::OkStatus();
  if (dp_ != nullptr) {
    float ok = wrote.ok() ? 1.f : 0.f;  // every DP rank learns whether all parts exist
    TESSERA_ASSIGN_OR_RETURN(runtime::Tensor buf, backend_->Empty({1}, tessera::DType::kF32));
    TESSERA_RETURN_IF_ERROR(backend_->CopyFromHost(&ok, buf));
    TESSERA_RETURN_IF_ERROR(dp_->AllReduce(buf.data(), buf.data(), 1, tessera::DType::kF32, comm::ReduceOp::kMin));
    TESSERA_RETURN_IF_ERROR(dp_->Synchronize());  // under the watchdog, before the host waits
    TESSERA_RETURN_IF_ERROR(backend_->CopyToHost(buf, &ok));
    if (ok < 1.f && wrote.ok()) wrote = absl::InternalError("generate: another DP rank could not write its part");
  }
  TESSERA_RETURN_IF_ERROR(wrote);
  v1::GenerateResponse result;
  result.set_prompts(end - begin), result.set_completions(completions), result.set_tokens(tokens);
  if (writer && dp_rank_ == 0) {
    std::string all;
    for (int r = 0; r < dps_; ++r) {
      const std::string p = absl::StrCat(g_.output(), ".part-", r);
      TESSERA_ASSIGN_OR_RETURN(std::string text, ReadFile(p));
      all += text;
    }
    TESSERA_RETURN_IF_ERROR(WriteFileAtomic(g_.output(), all));
    for (int r = 0; r < dps_; ++r) unlink(absl::StrCat(g_.output(), ".part-", r).c_str());
    result.set_output(g_.output());
  }
  result.set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return result;
}

}  // namespace tessera::executor
