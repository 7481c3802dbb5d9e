// A timeline of a process's GPU work — every kernel, copy and memset with its device,
// stream and times — from CUPTI's activity API, for bench/train_bench's `--trace PREFIX`.
// It exists because the GPU hosts' Nsight Systems (Nsight Compute's embedded copy)
// writes reports without CUDA records; bench/nsys_gaps.py reads both.
//
// libcupti is loaded at Start (dlopen, like cuBLASLt and cuDNN: nothing links it; the
// name, then the toolkit's folders): a host without it gets an error saying where it
// looked. One trace per process (CUPTI's buffer callbacks carry no user data); Start it
// before the process's first CUDA call so that no early kernel is missed.
//
// The file is CSV, one record per line, times in CUPTI's clock (ns; the same clock as
// Now(), so host ranges line up with the GPU's):
//   kind,start_ns,end_ns,device,stream,name
// kind: kernel | memcpy | memset | range (a host range added with Range()).
// Threading: Range/Now from any thread; Write once, after the GPU work to record is done.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera::bench {

class CuptiTrace {
 public:
  // Loads CUPTI and turns on the kernel, copy and memset records. FAILED_PRECONDITION if
  // a trace already runs in this process; UNAVAILABLE if CUPTI cannot be loaded or
  // refuses (the message names the call and CUPTI's reason).
  static absl::StatusOr<std::unique_ptr<CuptiTrace>> Start();
  ~CuptiTrace();
  CuptiTrace(const CuptiTrace&) = delete;
  CuptiTrace& operator=(const CuptiTrace&) = delete;

  uint64_t Now() const;  // CUPTI's timestamp, ns
  void Range(const std::string& name, uint64_t start_ns, uint64_t end_ns);
  // Flushes CUPTI's buffers and writes every record so far to `path` (written to
  // path + ".tmp", then renamed). Returns how many records of each kind in `summary`.
  absl::Status Write(const std::string& path, std::string* summary = nullptr);

 private:
  CuptiTrace() = default;
};

}  // namespace tessera::bench
