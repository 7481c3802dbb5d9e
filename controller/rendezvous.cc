#include "controller/rendezvous.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace tessera::controller {

void Rendezvous::Set(const ScopeKey& s, const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> l(mu_);
    scopes_[s].kv[key] = value;
  }
  cv_.notify_all();
}

absl::StatusOr<std::string> Rendezvous::Get(const ScopeKey& s, const std::string& key, int64_t timeout_ms) {
  std::unique_lock<std::mutex> l(mu_);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    auto& sc = scopes_[s];
    if (sc.dropped) return absl::AbortedError(absl::StrCat("rendezvous of ", s.first, " attempt ", s.second, " was closed"));
    auto it = sc.kv.find(key);
    if (it != sc.kv.end()) return it->second;
    if (cv_.wait_until(l, deadline) == std::cv_status::timeout) {
      auto& sc2 = scopes_[s];
      auto it2 = sc2.kv.find(key);
      if (it2 != sc2.kv.end()) return it2->second;
      return absl::DeadlineExceededError(absl::StrCat("rendezvous key '", key, "' was not set within ", timeout_ms, " ms"));
    }
  }
}

int64_t Rendezvous::Add(const ScopeKey& s, const std::string& key, int64_t delta) {
  int64_t v;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto& sc = scopes_[s];
    v = (sc.counters[key] += delta);
    sc.kv[key] = std::to_string(v);
  }
  cv_.notify_all();
  return v;
}

absl::Status Rendezvous::Barrier(const ScopeKey& s, const std::string& key, int world, int64_t timeout_ms) {
  std::unique_lock<std::mutex> l(mu_);
  std::string k = "__barrier/" + key;
  int64_t arrived = ++scopes_[s].counters[k];
  cv_.notify_all();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    auto& sc = scopes_[s];
    if (sc.dropped) return absl::AbortedError(absl::StrCat("rendezvous of ", s.first, " attempt ", s.second, " was closed"));
    if (sc.counters[k] >= world) return absl::OkStatus();
    if (cv_.wait_until(l, deadline) == std::cv_status::timeout && scopes_[s].counters[k] < world)
      return absl::DeadlineExceededError(absl::StrCat("barrier '", key, "': ", scopes_[s].counters[k], " of ", world,
                                                      " arrived within ", timeout_ms, " ms"));
    (void)arrived;
  }
}

void Rendezvous::Drop(const ScopeKey& s) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = scopes_.find(s);
    if (it == scopes_.end()) return;
    it->second.kv.clear();
    it->second.counters.clear();
    it->second.dropped = true;
  }
  cv_.notify_all();
}

size_t Rendezvous::ScopeCount() {
  std::lock_guard<std::mutex> l(mu_);
  size_t n = 0;
  for (auto& [k, v] : scopes_) n += v.dropped ? 0 : 1;
  return n;
}

}  // namespace tessera::controller
