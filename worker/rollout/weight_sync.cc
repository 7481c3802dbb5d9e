#include "worker/rollout/weight_sync.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera::engine {
namespace {
int64_t Elements(const model::Param& p) {
  int64_t n = 1;
  for (int64_t d : p.spec.shape) n *= d;
  return n;
}
absl::Status SameArchitecture(model::Llama& a, model::Llama& b) {
  if (a.params().size() != b.params().size())
    return absl::InvalidArgumentError(absl::StrCat("weight sync: the actor has ", a.params().size(),
                                                   " parameters, the rollout model ", b.params().size()));
  for (size_t i = 0; i < a.params().size(); ++i)
    if (a.params()[i].name() != b.params()[i].name() || a.params()[i].spec.shape != b.params()[i].spec.shape)
      return absl::InvalidArgumentError(absl::StrCat("weight sync: parameter ", i, " is ", a.params()[i].name(),
                                                     " on the actor and ", b.params()[i].name(), " on the rollout model"));
  return absl::OkStatus();
}
}  // namespace

absl::Status SyncColocated(model::Llama& actor, model::Llama& rollout) {
  if (&actor == &rollout) return absl::OkStatus();  // the same TP: the engine reads the actor's model
  TESSERA_RETURN_IF_ERROR(SameArchitecture(actor, rollout));
  // The two models may run on different backends of one device (an executor's training
  // session and its rollout pool each have their own stream): one buffer, written on the
  // actor's stream and read on the rollout's, so each tensor's gather is complete before
  // the rollout copies it out, and that copy is complete before the next gather reuses
  // the buffer. On one backend the stream orders both.
  runtime::Backend& a = actor.backend();
  runtime::Backend& r = rollout.backend();
  const bool two_streams = &a != &r;
  int64_t largest = 1;
  for (const model::Param& p : actor.params()) largest = std::max(largest, Elements(p));
  TESSERA_ASSIGN_OR_RETURN(runtime::Tensor buf, a.Empty({largest}, tessera::DType::kF32));
  for (size_t i = 0; i < actor.params().size(); ++i) {  // one tensor at a time, on the device
    TESSERA_ASSIGN_OR_RETURN(runtime::Tensor whole, buf.Slice(0, 0, Elements(actor.params()[i])));
    TESSERA_RETURN_IF_ERROR(actor.GatherGlobalInto(actor.params()[i], whole));
    if (two_streams) TESSERA_RETURN_IF_ERROR(a.Synchronize());
    TESSERA_RETURN_IF_ERROR(rollout.SetGlobalFrom(rollout.params()[i], whole));
    if (two_streams) TESSERA_RETURN_IF_ERROR(r.Synchronize());
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> SyncSplit(model::Llama* actor, model::Llama* rollout, comm::Communicator& bridge, int source,
                                  runtime::Backend& b, int64_t bucket_bytes) {
  if ((actor == nullptr) == (rollout == nullptr))
    return absl::InvalidArgumentError("weight sync: a rank of a split pool holds the actor or the rollout model");
  if (source < 0 || source >= bridge.size())
    return absl::InvalidArgumentError(absl::StrCat("weight sync: source rank ", source, " of ", bridge.size()));
  if (bridge.rank() == source && actor == nullptr)
    return absl::InvalidArgumentError("weight sync: the source rank must hold the actor");
  model::Llama& m = actor != nullptr ? *actor : *rollout;
  const int64_t bucket = std::max<int64_t>(bucket_bytes / 4, 1);
  int64_t sent = 0;
  size_t i = 0;
  while (i < m.params().size()) {
    // The next bucket: whole tensors, at least one, up to about bucket_bytes; gathered
    // into it, broadcast and re-sliced from it on the device.
    size_t end = i;
    int64_t n = 0;
    while (end < m.params().size() && (end == i || n + Elements(m.params()[end]) <= bucket)) n += Elements(m.params()[end++]);
    TESSERA_ASSIGN_OR_RETURN(runtime::Tensor buf, b.Empty({n}, tessera::DType::kF32));
    if (actor != nullptr) {  // every actor rank takes part in the TP gathers
      int64_t at = 0;
      for (size_t k = i; k < end; ++k) {
        const int64_t e = Elements(actor->params()[k]);
        TESSERA_ASSIGN_OR_RETURN(runtime::Tensor part, buf.Slice(0, at, e));
        TESSERA_RETURN_IF_ERROR(actor->GatherGlobalInto(actor->params()[k], part));
        at += e;
      }
    }
    TESSERA_RETURN_IF_ERROR(b.Synchronize());  // the bucket is complete before the bridge reads it
    TESSERA_RETURN_IF_ERROR(bridge.Broadcast(buf.data(), n, tessera::DType::kF32, source));
    TESSERA_RETURN_IF_ERROR(bridge.Synchronize());
    if (rollout != nullptr) {
      int64_t at = 0;
      for (size_t k = i; k < end; ++k) {
        const int64_t e = Elements(rollout->params()[k]);
        TESSERA_ASSIGN_OR_RETURN(runtime::Tensor part, buf.Slice(0, at, e));
        TESSERA_RETURN_IF_ERROR(rollout->SetGlobalFrom(rollout->params()[k], part));
        at += e;
      }
      TESSERA_RETURN_IF_ERROR(b.Synchronize());  // the bucket is reused (freed) only after the copies
    }
    sent += n * 4;
    i = end;
  }
  return sent;
}

}  // namespace tessera::engine
