// Built without CUDA: there is no CUDA backend.
#include "worker/runtime/backend.h"

namespace tessera::runtime {
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int) {
  return absl::UnimplementedError("this build has no CUDA support");
}
}  // namespace tessera::runtime
