// Executor side of the comm-check job: on one communicator, run each collective
// over each size on exactly verifiable inputs (small integers, exact in f32 and
// bf16 sums), time it, check every element, and report nccl-tests style
// algorithm and bus bandwidth.
#pragma once

#include <string>
#include <vector>


#include "absl/status/statusor.h"
#include "tessera/v1/executor_service.pb.h"
#include "worker/comm/communicator.h"

namespace tessera::executor {

// Where the communicator's buffers live and how to move data in and out of them.
class BufferSpace {
 public:
  virtual ~BufferSpace() = default;
  virtual absl::StatusOr<void*> Alloc(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  virtual absl::Status Upload(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status Download(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status Fill(void* dst, uint8_t byte, size_t bytes) = 0;
  // Elapsed seconds of `fn` (which enqueues work), measured the backend's way.
  virtual absl::StatusOr<double> Time(const std::function<absl::Status()>& fn, comm::Communicator& c) = 0;
};
std::unique_ptr<BufferSpace> MakeHostBufferSpace();

struct CommCheckArgs {
  std::vector<int64_t> sizes;
  std::vector<std::string> collectives;
  int iters = 5;
  int warmup = 1;
  tessera::DType dtype = tessera::DType::kF32;
};

// Appends one result per (collective, size) to `out`: time_us, algbw_gbps, busbw_gbps,
// errors, first_error.
absl::Status RunCommCheck(comm::Communicator& c, BufferSpace& space, const CommCheckArgs& args, int group_index,
                          v1::CommCheckResponse* out);

}  // namespace tessera::executor
