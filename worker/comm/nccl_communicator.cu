// NCCL backend (see nccl_communicator.h). Host code only; compiled by nvcc so that
// the CUDA build of the worker always exercises the toolkit.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <string>
#include <cstring>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/executor/cuda_buffer_space.h"

namespace tessera::comm {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

ncclDataType_t ToNccl(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kU8: return ncclUint8;
  }
  return ncclFloat32;
}
ncclRedOp_t ToNccl(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : op == ReduceOp::kMax ? ncclMax : ncclMin; }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::string name, int rank, int size, ncclComm_t comm, cudaStream_t stream, int device,
                   int64_t timeout_ms)
      : Communicator(std::move(name), rank, size), comm_(comm), stream_(stream), device_(device), timeout_ms_(timeout_ms) {}
  ~NcclCommunicator() override {
    if (!aborted_) ncclCommDestroy(comm_);
    if (before_) cudaEventDestroy(before_);
    if (after_) cudaEventDestroy(after_);
    cudaStreamDestroy(stream_);
  }
  absl::Status OrderWith(void* compute_stream) override {
    cudaSetDevice(device_);
    for (cudaEvent_t* e : {&before_, &after_})
      if (*e == nullptr)
        if (auto r = cudaEventCreateWithFlags(e, cudaEventDisableTiming); r != cudaSuccess) return CudaError(r, "cudaEventCreate");
    compute_ = static_cast<cudaStream_t>(compute_stream);
    return absl::OkStatus();
  }
  const char* backend() const override { return "nccl"; }

  // Waits for the stream under the watchdog: a collective stuck past the timeout
  // aborts the communicator and fails with DEADLINE_EXCEEDED.
  absl::Status Synchronize() override {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    while (true) {
      cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) return Describe(CudaError(q, "stream"), "synchronize");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        Abort();
        return Describe(absl::UnavailableError(absl::StrCat("NCCL error: ", ncclGetErrorString(async))), "synchronize");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        Abort();
        return Describe(absl::DeadlineExceededError(absl::StrCat(last_op(), " #", seq(), " did not complete within ",
                                                                 timeout_ms_, " ms; communicator aborted")), "watchdog");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  void Abort() override {
    if (!aborted_.exchange(true)) ncclCommAbort(comm_);
  }

 protected:
  // Non-blocking communicator: a call may return ncclInProgress; wait for it to be enqueued.
  absl::Status Check(ncclResult_t r) {
    if (aborted_) return absl::AbortedError("communicator was aborted");
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    while (r == ncclInProgress) {
      if (std::chrono::steady_clock::now() > deadline) {
        Abort();
        return absl::DeadlineExceededError("enqueue did not finish in time; communicator aborted");
      }
      ncclCommGetAsyncError(comm_, &r);
    }
    if (r != ncclSuccess) return absl::UnavailableError(absl::StrCat("NCCL: ", ncclGetErrorString(r), " ", ncclGetLastError(comm_)));
    return absl::OkStatus();
  }
  // With a compute stream (OrderWith): the stream waits for the compute enqueued so far,
  // and the compute stream for the operation. Inside a group the events go around the
  // whole group (nothing is launched before ncclGroupEnd).
  absl::Status WaitForCompute() {
    if (compute_ == nullptr) return absl::OkStatus();
    if (auto e = cudaEventRecord(before_, compute_); e != cudaSuccess) return CudaError(e, "cudaEventRecord");
    if (auto e = cudaStreamWaitEvent(stream_, before_, 0); e != cudaSuccess) return CudaError(e, "cudaStreamWaitEvent");
    return absl::OkStatus();
  }
  void SetOverlap(bool on) override { overlap_ = on; }
  absl::Status Join() override {
    if (compute_ == nullptr) return absl::OkStatus();
    if (auto e = cudaEventRecord(after_, stream_); e != cudaSuccess) return CudaError(e, "cudaEventRecord");
    if (auto e = cudaStreamWaitEvent(compute_, after_, 0); e != cudaSuccess) return CudaError(e, "cudaStreamWaitEvent");
    return absl::OkStatus();
  }
  absl::Status ComputeWaits() { return overlap_ ? absl::OkStatus() : Join(); }
  template <typename F>
  absl::Status Ordered(F&& enqueue) {
    if (in_group_) return Check(enqueue());
    if (absl::Status s = WaitForCompute(); !s.ok()) return s;
    if (absl::Status s = Check(enqueue()); !s.ok()) return s;
    return ComputeWaits();
  }
  absl::Status DoAllReduce(const void* in, void* out, size_t n, DType t, ReduceOp op) override {
    return Ordered([&] { return ncclAllReduce(in, out, n, ToNccl(t), ToNccl(op), comm_, stream_); });
  }
  absl::Status DoReduceScatter(const void* in, void* out, size_t n, DType t, ReduceOp op) override {
    return Ordered([&] { return ncclReduceScatter(in, out, n, ToNccl(t), ToNccl(op), comm_, stream_); });
  }
  absl::Status DoAllGather(const void* in, void* out, size_t n, DType t) override {
    return Ordered([&] { return ncclAllGather(in, out, n, ToNccl(t), comm_, stream_); });
  }
  absl::Status DoBroadcast(void* buf, size_t n, DType t, int root) override {
    return Ordered([&] { return ncclBroadcast(buf, buf, n, ToNccl(t), root, comm_, stream_); });
  }
  absl::Status DoSend(const void* buf, size_t n, DType t, int peer) override {
    return Ordered([&] { return ncclSend(buf, n, ToNccl(t), peer, comm_, stream_); });
  }
  absl::Status DoRecv(void* buf, size_t n, DType t, int peer) override {
    return Ordered([&] { return ncclRecv(buf, n, ToNccl(t), peer, comm_, stream_); });
  }
  absl::Status DoBarrier() override {
    if (!barrier_buf_) {
      if (auto e = cudaMalloc(&barrier_buf_, 4); e != cudaSuccess) return CudaError(e, "cudaMalloc");
    }
    auto s = Check(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_, stream_));
    if (!s.ok()) return s;
    return Synchronize();
  }
  void DoGroupStart() override {
    group_error_.clear();
    if (absl::Status w = WaitForCompute(); !w.ok()) group_error_ = std::string(w.message());
    in_group_ = true;
    ncclGroupStart();
  }
  absl::Status DoGroupEnd() override {
    in_group_ = false;
    absl::Status s = Check(ncclGroupEnd());
    if (!s.ok()) return s;
    if (!group_error_.empty()) return absl::InternalError(group_error_);
    return ComputeWaits();
  }

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_;
  int64_t timeout_ms_;
  std::atomic<bool> aborted_{false};
  void* barrier_buf_ = nullptr;
  cudaStream_t compute_ = nullptr;  // OrderWith
  cudaEvent_t before_ = nullptr, after_ = nullptr;
  bool in_group_ = false;
  bool overlap_ = false;  // SetOverlap: compute waits at Join() only
  std::string group_error_;  // of the wait enqueued at GroupStart
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(const std::string& name, const std::string& key,
                                                                   int rank, int size, KvStore* rdv,
                                                                   const NcclOptions& opts) {
  auto fail = [&](const std::string& m) {
    return absl::UnavailableError(absl::StrCat("communicator '", name, "' (nccl, rank ", rank, " of ", size, "): ", m));
  };
  if (auto e = cudaSetDevice(opts.device); e != cudaSuccess) return fail(absl::StrCat("cudaSetDevice: ", cudaGetErrorString(e)));
  ncclUniqueId id;
  std::string k = "nccl/" + key + "/id";
  if (rank == 0) {
    if (ncclGetUniqueId(&id) != ncclSuccess) return fail("ncclGetUniqueId failed");
    auto st = rdv->Set(k, std::string(reinterpret_cast<char*>(&id), sizeof(id)));
    if (!st.ok()) return fail(std::string(st.message()));
  } else {
    auto v = rdv->Get(k, opts.timeout_ms);
    if (!v.ok()) return fail(std::string(v.status().message()));
    if (v->size() != sizeof(id)) return fail("malformed unique id in the rendezvous");
    std::memcpy(&id, v->data(), sizeof(id));
  }
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = name.c_str();
  ncclComm_t comm;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &cfg);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts.timeout_ms);
  while (r == ncclInProgress) {
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm);
      return fail(absl::StrCat("ncclCommInitRankConfig did not finish within ", opts.timeout_ms, " ms"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ncclCommGetAsyncError(comm, &r);
  }
  if (r != ncclSuccess) return fail(absl::StrCat("ncclCommInitRankConfig: ", ncclGetErrorString(r)));
  cudaStream_t stream;
  if (auto e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess)
    return fail(absl::StrCat("cudaStreamCreate: ", cudaGetErrorString(e)));
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(name, rank, size, comm, stream, opts.device,
                                                                          opts.timeout_ms));
}

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

CudaDeviceInfo CudaDevice(int index) {
  cudaDeviceProp p;
  CudaDeviceInfo info;
  if (cudaGetDeviceProperties(&p, index) == cudaSuccess) {
    info.name = p.name;
    info.memory_bytes = static_cast<int64_t>(p.totalGlobalMem);
  }
  return info;
}

}  // namespace tessera::comm

namespace tessera::executor {
namespace {
class CudaSpace final : public BufferSpace {
 public:
  explicit CudaSpace(int device) : device_(device) {}
  absl::StatusOr<void*> Alloc(size_t bytes) override {
    cudaSetDevice(device_);
    void* p = nullptr;
    if (auto e = cudaMalloc(&p, bytes); e != cudaSuccess)
      return absl::ResourceExhaustedError(absl::StrCat("cudaMalloc(", bytes, "): ", cudaGetErrorString(e)));
    return p;
  }
  void Free(void* p) override { cudaFree(p); }
  absl::Status Upload(void* d, const void* s, size_t n) override {
    auto e = cudaMemcpy(d, s, n, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(e));
  }
  absl::Status Download(void* d, const void* s, size_t n) override {
    auto e = cudaMemcpy(d, s, n, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(e));
  }
  absl::Status Fill(void* d, uint8_t b, size_t n) override {
    auto e = cudaMemset(d, b, n);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    return e == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(e));
  }
  // Times with host clocks around enqueue + Synchronize (the stream is private to
  // the communicator and nothing else runs on the device).
  absl::StatusOr<double> Time(const std::function<absl::Status()>& fn, comm::Communicator& c) override {
    auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = fn(); !s.ok()) return s;
    if (absl::Status s = c.Synchronize(); !s.ok()) return s;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  int device_;
};
}  // namespace
std::unique_ptr<BufferSpace> MakeCudaBufferSpace(int device) { return std::make_unique<CudaSpace>(device); }
}  // namespace tessera::executor
