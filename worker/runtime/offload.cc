#include "worker/runtime/offload.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera::runtime {
namespace {
constexpr int64_t kAlign = 256;  // each storage's bytes start aligned in the host buffer
}

absl::Status HostOffload::Offload(const std::vector<Tensor>& tensors) {
  if (offloaded()) return absl::OkStatus();
  std::set<Storage*> seen;
  std::vector<Parked> parked;
  int64_t total = 0;
  for (const Tensor& t : tensors) {
    if (!t.defined() || !(t.device() == backend_->device()) || t.storage()->detached()) continue;
    if (!seen.insert(t.storage().get()).second) continue;
    parked.push_back({t.storage(), total});
    total += (static_cast<int64_t>(t.storage()->bytes()) + kAlign - 1) / kAlign * kAlign;
  }
  if (total > host_size_) {
    host_.reset();  // the old buffer first: page-locked memory is the host's scarcest
    host_size_ = 0;
    auto buf = backend_->AllocHostStaging(static_cast<size_t>(total));
    if (!buf.ok())
      return absl::ResourceExhaustedError(absl::StrCat("offload: ", total, " bytes of host memory for the device states: ",
                                                       buf.status().message()));
    host_ = std::move(*buf);
    host_size_ = total;
  }
  // The copies first (each returns with its bytes on the host), then the frees: a failed
  // copy leaves every tensor where it was.
  for (const Parked& p : parked) TESSERA_RETURN_IF_ERROR(backend_->CopyToHost(Tensor::Bytes(p.storage), host_.get() + p.at));
  for (const Parked& p : parked) p.storage->Detach();
  TESSERA_RETURN_IF_ERROR(backend_->Synchronize());  // the memory is free for other streams
  parked_ = std::move(parked);
  bytes_ = total;
  return absl::OkStatus();
}

absl::Status HostOffload::Restore() {
  for (const Parked& p : parked_) {
    if (!p.storage->detached()) continue;  // restored by a Restore that failed later
    absl::Status s = p.storage->Reattach();
    if (!s.ok())
      return absl::ResourceExhaustedError(absl::StrCat("restoring ", bytes_, " offloaded bytes to ", backend_->device().ToString(),
                                                       ": ", s.message()));
    Tensor bytes = Tensor::Bytes(p.storage);
    TESSERA_RETURN_IF_ERROR(backend_->CopyFromHost(host_.get() + p.at, bytes));
  }
  TESSERA_RETURN_IF_ERROR(backend_->Synchronize());  // the host buffer is reused by the next Offload
  parked_.clear();
  return absl::OkStatus();
}

}  // namespace tessera::runtime
