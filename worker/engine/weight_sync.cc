#include "worker/engine/weight_sync.h"

#include <cstring>
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
  for (size_t i = 0; i < actor.params().size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<float> whole, actor.GatherGlobal(actor.params()[i], /*grad=*/false));
    TESSERA_RETURN_IF_ERROR(rollout.SetGlobal(rollout.params()[i], whole));
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
    // The next bucket: whole tensors, at least one, up to about bucket_bytes.
    size_t end = i;
    int64_t n = 0;
    while (end < m.params().size() && (end == i || n + Elements(m.params()[end]) <= bucket)) n += Elements(m.params()[end++]);
    std::vector<float> host(n);
    if (actor != nullptr) {  // every actor rank takes part in the TP gathers
      int64_t at = 0;
      for (size_t k = i; k < end; ++k) {
        TESSERA_ASSIGN_OR_RETURN(std::vector<float> whole, actor->GatherGlobal(actor->params()[k], /*grad=*/false));
        std::memcpy(host.data() + at, whole.data(), whole.size() * sizeof(float));
        at += static_cast<int64_t>(whole.size());
      }
    }
    TESSERA_ASSIGN_OR_RETURN(runtime::Tensor buf, b.Empty({n}, runtime::DType::kF32));
    TESSERA_RETURN_IF_ERROR(b.CopyFromHost(host.data(), buf));
    TESSERA_RETURN_IF_ERROR(bridge.Broadcast(buf.data(), n, runtime::DType::kF32, source));
    TESSERA_RETURN_IF_ERROR(bridge.Synchronize());
    if (rollout != nullptr) {
      TESSERA_RETURN_IF_ERROR(b.CopyToHost(buf, host.data()));
      int64_t at = 0;
      for (size_t k = i; k < end; ++k) {
        const int64_t e = Elements(rollout->params()[k]);
        TESSERA_RETURN_IF_ERROR(rollout->SetGlobal(rollout->params()[k], std::vector<float>(host.begin() + at, host.begin() + at + e)));
        at += e;
      }
    }
    sent += n * 4;
    i = end;
  }
  return sent;
}

}  // namespace tessera::engine
