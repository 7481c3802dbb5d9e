// The executor's client of the controller's RendezvousService, scoped to its job
// attempt, and a gloo::rendezvous::Store backed by it (Gloo's bootstrap).
//
// Threading: thread-safe (gRPC stubs are).
#pragma once

#include <gloo/rendezvous/store.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tessera/v1/rendezvous_service.grpc.pb.h"

namespace tessera::comm {

// The key-value operations communicator bootstrap needs (Gloo's store, NCCL's
// unique id). RendezvousClient implements it over gRPC; tests use an in-memory one.
class KvStore {
 public:
  virtual ~KvStore() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits up to timeout_ms for the key (DEADLINE_EXCEEDED).
  virtual absl::StatusOr<std::string> Get(const std::string& key, int64_t timeout_ms) = 0;
};

class RendezvousClient final : public KvStore {
 public:
  RendezvousClient(std::shared_ptr<grpc::Channel> ch, std::string job_id, int attempt, std::string secret);
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, int64_t timeout_ms) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  absl::Status Barrier(const std::string& key, int world, int64_t timeout_ms);
  absl::Status RegisterExecutor(int executor, const std::string& address);
  // OK while this attempt is the job's live one (one try, `timeout_ms`; UNAVAILABLE and
  // DEADLINE_EXCEEDED when the controller cannot be reached).
  absl::Status CheckAttempt(int64_t timeout_ms);

 private:
  v1::Scope scope_;
  std::string secret_;
  std::unique_ptr<v1::RendezvousService::Stub> stub_;
};

// Gloo store over the rendezvous, under `prefix` (one per communicator).
// Gloo expects exceptions from a store; errors are thrown as gloo::IoException.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(KvStore* rdv, std::string prefix, int64_t timeout_ms)
      : rdv_(rdv), prefix_(std::move(prefix)), timeout_ms_(timeout_ms) {}
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  KvStore* rdv_;
  std::string prefix_;
  int64_t timeout_ms_;
};

}  // namespace tessera::comm
