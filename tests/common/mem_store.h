// An in-memory KvStore for communicator tests (what the rendezvous is in production).
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>

#include "worker/comm/rendezvous_client.h"

namespace tessera::testing {

class MemStore : public comm::KvStore {
 public:
  absl::Status Set(const std::string& k, const std::string& v) override {
    std::lock_guard<std::mutex> l(mu_);
    kv_[k] = v;
    cv_.notify_all();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& k, int64_t timeout_ms) override {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_for(l, std::chrono::milliseconds(timeout_ms), [&] { return kv_.count(k) > 0; }))
      return absl::DeadlineExceededError("no key " + k);
    return kv_[k];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};

}  // namespace tessera::testing
