#include "worker/executor/environment_client.h"

#include <chrono>
#include <cstring>

#include <grpcpp/channel.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera::executor {

absl::StatusOr<std::unique_ptr<EnvironmentClient>> EnvironmentClient::Create(const v1::JobSpec& spec, comm::Communicator* tp,
                                                                             runtime::Backend* backend) {
  if (spec.rl().environment().empty()) return std::unique_ptr<EnvironmentClient>();
  auto c = std::make_unique<EnvironmentClient>();
  c->rl_ = spec.rl(), c->job_ = spec.name(), c->tp_ = tp, c->backend_ = backend;
  if (tp == nullptr || tp->rank() == 0) {
    TESSERA_ASSIGN_OR_RETURN(auto channel, UserServiceChannel("rl.environment", c->rl_.environment(), c->rl_.environment_ca_cert()));
    c->stub_ = v1::EnvironmentService::NewStub(channel);
  }
  return c;
}

absl::Status EnvironmentClient::Failure(const char* rpc, const grpc::Status& st) const {
  const std::string why = st.error_code() == grpc::DEADLINE_EXCEEDED
                              ? absl::StrCat("no answer within ", rl_.environment_timeout_s(), " s")
                              : absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(st.error_code())),
                                             st.error_message().empty() ? "" : ": ", st.error_message());
  return absl::UnavailableError(absl::StrCat("rl.environment ", rl_.environment(), ": ", rpc, " failed (", why, ")"));
}

void EnvironmentClient::SetDeadline(grpc::ClientContext& ctx) const {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(rl_.environment_timeout_s() * 1000)));
}

absl::Status EnvironmentClient::Shared(std::chrono::steady_clock::time_point t0, bool ok, std::string* bytes) {
  TESSERA_RETURN_IF_ERROR(ShareWithTp(&ok, bytes));
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (ok) return absl::OkStatus();
  if (stub_ == nullptr) return absl::AbortedError(absl::StrCat("TP rank 0's environment call failed: ", *bytes));
  return absl::UnavailableError(*bytes);
}

absl::Status EnvironmentClient::ShareWithTp(bool* ok, std::string* bytes) {
  if (tp_ == nullptr || tp_->size() == 1) return absl::OkStatus();
  int32_t head[2] = {*ok ? 1 : 0, static_cast<int32_t>(bytes->size())};
  TESSERA_ASSIGN_OR_RETURN(runtime::Tensor h, backend_->Empty({2}, DType::kI32));
  TESSERA_RETURN_IF_ERROR(backend_->CopyFromHost(head, h));
  TESSERA_RETURN_IF_ERROR(tp_->Broadcast(h.data(), 2, DType::kI32, 0));
  TESSERA_RETURN_IF_ERROR(tp_->Synchronize());
  TESSERA_RETURN_IF_ERROR(backend_->CopyToHost(h, head));
  if (tp_->rank() != 0) *ok = head[0] == 1, bytes->assign(static_cast<size_t>(head[1]), '\0');
  if (head[1] > 0) {
    TESSERA_ASSIGN_OR_RETURN(runtime::Tensor b, backend_->Empty({head[1]}, DType::kU8));
    TESSERA_RETURN_IF_ERROR(backend_->CopyFromHost(bytes->data(), b));
    TESSERA_RETURN_IF_ERROR(tp_->Broadcast(b.data(), static_cast<size_t>(head[1]), DType::kU8, 0));
    TESSERA_RETURN_IF_ERROR(tp_->Synchronize());
    TESSERA_RETURN_IF_ERROR(backend_->CopyToHost(b, bytes->data()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<EnvironmentClient::Observation>> EnvironmentClient::Step(int64_t step, int dp_rank,
                                                                                     const std::vector<v1::EnvToolCall>& calls) {
  const auto t0 = std::chrono::steady_clock::now();
  bool ok = false;
  std::string bytes;  // the response (ok) or the error
  if (stub_ != nullptr) {
    v1::EnvStepRequest req;
    req.set_job(job_), req.set_step(step), req.set_dp_rank(dp_rank);
    for (const v1::EnvToolCall& c : calls) *req.add_calls() = c;
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::EnvStepResponse resp;
    const grpc::Status st = stub_->Step(&ctx, req, &resp);
    if (!st.ok()) {
      bytes = std::string(Failure("Step", st).message());
    } else if (resp.observations_size() != static_cast<int>(calls.size())) {
      bytes = absl::StrCat("rl.environment ", rl_.environment(), ": ", resp.observations_size(), " observations for ",
                           calls.size(), " tool calls");
    } else {
      ok = true;
      resp.SerializeToString(&bytes);
    }
  }
  TESSERA_RETURN_IF_ERROR(Shared(t0, ok, &bytes));
  v1::EnvStepResponse resp;
  if (!resp.ParseFromString(bytes)) return absl::DataLossError("rl.environment: TP rank 0's observations did not parse");
  std::vector<Observation> out(calls.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].text = resp.observations(static_cast<int>(i)).text();
    out[i].done = resp.observations(static_cast<int>(i)).done();
  }
  return out;
}

absl::Status EnvironmentClient::End(int64_t step, int dp_rank, const std::vector<std::string>& sessions) {
  if (sessions.empty()) return absl::OkStatus();
  const auto t0 = std::chrono::steady_clock::now();
  bool ok = true;
  std::string bytes;
  if (stub_ != nullptr) {
    v1::EnvEndRequest req;
    req.set_job(job_), req.set_step(step), req.set_dp_rank(dp_rank);
    for (const std::string& s : sessions) req.add_sessions(s);
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::EnvEndResponse resp;
    const grpc::Status st = stub_->End(&ctx, req, &resp);
    if (!st.ok()) ok = false, bytes = std::string(Failure("End", st).message());
  }
  TESSERA_RETURN_IF_ERROR(Shared(t0, ok, &bytes));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<engine::Completion>> RunEpisodes(engine::RolloutEngine& rollout,
                                                            const std::vector<engine::GenerationRequest>& requests,
                                                            const RlPrompts& prompts, EnvironmentClient* env,
                                                            const EpisodeRound& round, const std::vector<std::string>& prompt_texts,
                                                            const std::vector<std::string>& answers, engine::EpisodeStats* stats) {
  if (env == nullptr) {
    auto done = rollout.Generate(requests);
    if (stats != nullptr) *stats = {}, stats->Add(rollout);
    return done;
  }
  std::vector<std::string> sessions;  // in the order of their first call
  auto session = [&](const engine::ToolCall& c) {
    return absl::StrCat(round.phase, "/", round.step, "/", round.refill, "/", round.first_prompt + c.request, "/", c.sample);
  };
  const engine::ObserveFn observe = [&](const std::vector<engine::ToolCall>& calls)
      -> absl::StatusOr<std::vector<engine::Observation>> {
    std::vector<v1::EnvToolCall> req(calls.size());
    for (size_t i = 0; i < calls.size(); ++i) {
      const engine::ToolCall& c = calls[i];
      v1::EnvToolCall& r = req[i];
      r.set_session(session(c));
      if (c.turn == 1) sessions.push_back(r.session());
      r.set_turn(c.turn);
      r.set_prompt(prompt_texts[c.request]);
      r.set_reference(answers[c.request]);
      r.set_response(prompts.RawText(*c.response));
      r.set_call(prompts.RawText(*c.response, c.call_begin));
    }
    TESSERA_ASSIGN_OR_RETURN(std::vector<EnvironmentClient::Observation> seen, env->Step(round.step, round.dp_rank, req));
    std::vector<engine::Observation> out(seen.size());
    for (size_t i = 0; i < seen.size(); ++i) {
      out[i].done = seen[i].done;
      if (out[i].done) continue;
      auto ids = prompts.EncodeText(seen[i].text);
      if (!ids.ok())
        return absl::InvalidArgumentError(absl::StrCat("rl.environment ", req[i].session(), ": the observation does not encode: ",
                                                       ids.status().message()));
      out[i].tokens = std::move(*ids);
    }
    return out;
  };
  TESSERA_ASSIGN_OR_RETURN(std::vector<engine::Completion> done,
                           engine::GenerateEpisodes(rollout, requests, prompts.multi_turn(), observe, stats));
  TESSERA_RETURN_IF_ERROR(env->End(round.step, round.dp_rank, sessions));
  return done;
}

}  // namespace tessera::executor
