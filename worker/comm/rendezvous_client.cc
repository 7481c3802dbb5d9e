#include "worker/comm/rendezvous_client.h"

#include <gloo/common/error.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_util.h"
#include "common/status.h"

namespace tessera::comm {

RendezvousClient::RendezvousClient(std::shared_ptr<grpc::Channel> ch, std::string job_id, int attempt, std::string secret)
    : secret_(std::move(secret)), stub_(v1::RendezvousService::NewStub(ch)) {
  scope_.set_job_id(std::move(job_id));
  scope_.set_attempt(attempt);
}

// Every call but Add is idempotent and retried through a lost or slow connection within
// its deadline (CallWithRetry); Add would count twice, so it only waits for the connection.
absl::Status RendezvousClient::Set(const std::string& key, const std::string& value) {
  v1::SetRequest req;
  *req.mutable_scope() = scope_;
  req.set_key(key);
  req.set_value(value);
  v1::SetResponse resp;
  return FromGrpc(CallWithRetry(secret_, 30000, [&](grpc::ClientContext* ctx, int64_t) { return stub_->Set(ctx, req, &resp); }));
}

absl::StatusOr<std::string> RendezvousClient::Get(const std::string& key, int64_t timeout_ms) {
  v1::GetRequest req;
  *req.mutable_scope() = scope_;
  req.set_key(key);
  v1::GetResponse resp;
  // The server waits up to timeout_ms for the key; the call has 10 s more for the network.
  auto st = CallWithRetry(secret_, timeout_ms + 10000, [&](grpc::ClientContext* ctx, int64_t left) {
    req.set_timeout_ms(std::clamp<int64_t>(left - 10000, 0, timeout_ms));
    return stub_->Get(ctx, req, &resp);
  });
  if (!st.ok()) return FromGrpc(st);
  return resp.value();
}

absl::StatusOr<int64_t> RendezvousClient::Add(const std::string& key, int64_t delta) {
  grpc::ClientContext ctx;
  PrepareContext(ctx, secret_, 30000);
  ctx.set_wait_for_ready(true);
  v1::AddRequest req;
  *req.mutable_scope() = scope_;
  req.set_key(key);
  req.set_delta(delta);
  v1::AddResponse resp;
  auto st = stub_->Add(&ctx, req, &resp);
  if (!st.ok()) return FromGrpc(st);
  return resp.value();
}

absl::Status RendezvousClient::Barrier(const std::string& key, int world, int64_t timeout_ms) {
  // The server counts arrivals by caller-free increments; a retried Barrier after a lost
  // reply would arrive twice, so like Add it only waits for the connection.
  grpc::ClientContext ctx;
  PrepareContext(ctx, secret_, timeout_ms + 10000);
  ctx.set_wait_for_ready(true);
  v1::BarrierRequest req;
  *req.mutable_scope() = scope_;
  req.set_key(key);
  req.set_world(world);
  req.set_timeout_ms(timeout_ms);
  v1::BarrierResponse resp;
  return FromGrpc(stub_->Barrier(&ctx, req, &resp));
}

absl::Status RendezvousClient::RegisterExecutor(int executor, const std::string& address) {
  v1::RegisterExecutorRequest req;
  *req.mutable_scope() = scope_;
  req.set_executor(executor);
  req.set_address(address);
  v1::RegisterExecutorResponse resp;
  return FromGrpc(CallWithRetry(secret_, 60000, [&](grpc::ClientContext* ctx, int64_t) {
    return stub_->RegisterExecutor(ctx, req, &resp);
  }));
}

absl::Status RendezvousClient::CheckAttempt(int64_t timeout_ms) {
  grpc::ClientContext ctx;
  PrepareContext(ctx, secret_, timeout_ms);
  v1::CheckAttemptRequest req;
  *req.mutable_scope() = scope_;
  v1::CheckAttemptResponse resp;
  return FromGrpc(stub_->CheckAttempt(&ctx, req, &resp));
}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  auto st = rdv_->Set(prefix_ + "/" + key, std::string(data.begin(), data.end()));
  if (!st.ok()) throw gloo::IoException(absl::StrCat("rendezvous set ", key, ": ", st.message()));
}

std::vector<char> GlooStore::get(const std::string& key) {
  auto v = rdv_->Get(prefix_ + "/" + key, timeout_ms_);
  if (!v.ok()) throw gloo::IoException(absl::StrCat("rendezvous get ", key, ": ", v.status().message()));
  return std::vector<char>(v->begin(), v->end());
}

void GlooStore::wait(const std::vector<std::string>& keys) { wait(keys, std::chrono::milliseconds(timeout_ms_)); }

void GlooStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  for (const auto& k : keys) {
    auto v = rdv_->Get(prefix_ + "/" + k, timeout.count() > 0 ? timeout.count() : timeout_ms_);
    if (!v.ok()) throw gloo::IoException(absl::StrCat("rendezvous wait ", k, ": ", v.status().message()));
  }
}

}  // namespace tessera::comm
