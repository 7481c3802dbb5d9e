// Built when CUDA is not available: GPU devices cannot exist, so NCCL is never reached.
#include "worker/comm/nccl_communicator.h"

namespace tessera::comm {
absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(const std::string& name, const std::string&, int,
                                                                   int, KvStore*, const NcclOptions&) {
  return absl::UnimplementedError("communicator '" + name + "': this build has no CUDA/NCCL support");
}
}  // namespace tessera::comm

