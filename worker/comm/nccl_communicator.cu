// NCCL backend (see nccl_communicator.h). Host code only; compiled by nvcc so that
// the CUDA build of the worker always exercises the toolkit.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <cstring>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "worker/comm/nccl_communicator.h"

namespace tessera::comm {
namespace {

#define TESSERA_NCCL_LINK_OR_RETURN(lhs, expr)   \
  LinkComm* lhs = nullptr;                         \
  {                                                \
    absl::StatusOr<LinkComm*> got_link = (expr);   \
    if (!got_link.ok()) return got_link.status();  \
    lhs = *got_link;                               \
  }

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

// Splits a non-blocking `parent` into a blocking child (named `name`, or unnamed when
// null) under a deadline. The split is a collective of the parent that NCCL completes in
// the background, and a non-blocking parent takes no new call before it completes, so
// every rank — one passing NCCL_SPLIT_NOCOLOR too — waits for it here: a rank outside a
// pipeline link that went straight on to its next split would be refused by the parent
// ("Attempt to use communicator before the previous operation returned ncclSuccess"),
// and the link's own ranks would wait forever. Returns the child, or null for
// NCCL_SPLIT_NOCOLOR.
absl::StatusOr<ncclComm_t> SplitBlocking(ncclComm_t parent, int color, int key, const char* name, int64_t timeout_ms) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 1;
  if (name != nullptr) cfg.commName = name;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto settle = [&](ncclComm_t comm, ncclResult_t r) {
    while (r == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      ncclCommGetAsyncError(comm, &r);
    }
    return r;
  };
  auto failed = [&](ncclComm_t comm, ncclResult_t r, const char* what) {
    if (r == ncclInProgress)
      return absl::DeadlineExceededError(absl::StrCat("ncclCommSplit ", what, " within ", timeout_ms, " ms"));
    return absl::UnavailableError(absl::StrCat("NCCL: ", ncclGetErrorString(r), " ", ncclGetLastError(comm)));
  };
  volatile ncclComm_t child = nullptr;  // filled in the background
  ncclResult_t r = ncclCommSplit(parent, color, key, const_cast<ncclComm_t*>(&child), &cfg);
  // The parent's own state, whatever the call returned: a split that returns ncclSuccess
  // (a rank passing NCCL_SPLIT_NOCOLOR may get it at once) can still be completing on
  // the parent, which then refuses the next split (seen with pp 4 on 4x H200: "Attempt
  // to use communicator before the previous operation returned ncclSuccess" at a link's
  // first receive; the helper had skipped this poll when the call said ncclSuccess).
  if (r == ncclSuccess || r == ncclInProgress) ncclCommGetAsyncError(parent, &r);
  r = settle(parent, r);
  if (r != ncclSuccess) return failed(parent, r, "did not complete");
  if (color == NCCL_SPLIT_NOCOLOR) return nullptr;
  while (child == nullptr && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  if (child == nullptr)
    return absl::DeadlineExceededError(absl::StrCat("ncclCommSplit gave no communicator within ", timeout_ms, " ms"));
  ncclComm_t c = child;
  ncclCommGetAsyncError(c, &r);  // the child's own initialization
  if (r = settle(c, r); r != ncclSuccess) {
    absl::Status s = failed(c, r, "did not initialize the new communicator");
    ncclCommAbort(c);
    return s;
  }
  return c;
}

class NcclCommunicator final : public Communicator {
 public:
  // boot: the non-blocking communicator made at init (splits under a deadline); comm: the
  // blocking one split from it that runs the collectives (MakeNcclCommunicator says why).
  NcclCommunicator(std::string name, int rank, int size, ncclComm_t boot, ncclComm_t comm, cudaStream_t stream,
                   int device, int64_t timeout_ms, bool trace)
      : Communicator(std::move(name), rank, size), boot_(boot), comm_(comm), stream_(stream), device_(device),
        timeout_ms_(timeout_ms), trace_(trace) {}
  // The priority of the link streams made later (stream_ is made with it by the caller).
  void Trace(const char* op, int peer, int tag) {
    if (trace_) fprintf(stderr, "trace %s r%d %s #%llu peer %d tag %d\n", name().c_str(), rank(), op,
                        static_cast<unsigned long long>(seq()), peer, tag);
  }
  ~NcclCommunicator() override {
    for (auto& [key, link] : links_) {
      if (!aborted_) ncclCommDestroy(link.comm);
      cudaStreamDestroy(link.stream);
    }
    if (!aborted_) {
      ncclCommDestroy(comm_);
      if (boot_ != comm_) ncclCommDestroy(boot_);
    }
    if (before_) cudaEventDestroy(before_);
    if (after_) cudaEventDestroy(after_);
    if (host_dev_) cudaFreeAsync(host_dev_, stream_);  // released once stream_ drains
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
      for (auto& [key, link] : links_)
        if (q == cudaSuccess) q = cudaStreamQuery(link.stream);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) return Describe(CudaError(q, "stream"), "synchronize");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        Abort();
        return Describe(absl::UnavailableError(absl::StrCat("NCCL error: ", ncclGetErrorString(async))), "synchronize");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        const std::string busy = BusyStreams();
        Abort();
        return Describe(absl::DeadlineExceededError(absl::StrCat(last_op(), " #", seq(), " did not complete within ",
                                                                 timeout_ms_, " ms (still running: ", busy,
                                                                 "); communicator aborted")), "watchdog");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // The streams with work left, each with the last operation enqueued on it: which of
  // the group's stream and its links a stuck wait is waiting for.
  std::string BusyStreams() {
    std::string out;
    auto add = [&](const std::string& what) { absl::StrAppend(&out, out.empty() ? "" : ", ", what); };
    if (cudaStreamQuery(stream_) == cudaErrorNotReady) add(absl::StrCat("group stream, last ", group_op_, " #", group_seq_));
    for (auto& [key, link] : links_)
      if (cudaStreamQuery(link.stream) == cudaErrorNotReady)
        add(absl::StrCat("link ", std::get<0>(key), "->", std::get<1>(key), " tag ", std::get<2>(key), ", last ",
                         link.last_op, " #", link.last_seq));
    return out.empty() ? "none" : out;
  }
  void Abort() override {
    if (aborted_.exchange(true)) return;
    for (auto& [key, link] : links_) ncclCommAbort(link.comm);
    ncclCommAbort(comm_);
    if (boot_ != comm_) ncclCommAbort(boot_);
  }

 protected:
  // Non-blocking communicator: a call may return ncclInProgress; wait for it to be enqueued.
  absl::Status Check(ncclResult_t r) { return CheckOn(comm_, r); }
  absl::Status CheckOn(ncclComm_t comm, ncclResult_t r) {
    if (aborted_) return absl::AbortedError("communicator was aborted");
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    while (r == ncclInProgress) {
      if (std::chrono::steady_clock::now() > deadline) {
        Abort();
        return absl::DeadlineExceededError("enqueue did not finish in time; communicator aborted");
      }
      ncclCommGetAsyncError(comm, &r);
    }
    if (r != ncclSuccess) return absl::UnavailableError(absl::StrCat("NCCL: ", ncclGetErrorString(r), " ", ncclGetLastError(comm)));
    return absl::OkStatus();
  }

  static constexpr int kLinkTags = 3;  // activations, gradients, tied-embedding gradients
  struct LinkComm {
    ncclComm_t comm = nullptr;  // two ranks: the sender is rank 0
    cudaStream_t stream = nullptr;
    bool pending = false;        // sends not yet joined (WaitSends)
    const char* last_op = "none";  // what the stream ran last, for the watchdog's message
    uint64_t last_seq = 0;
  };
  // Every link between ring neighbours (src -> src ± 1 mod size) for each of the 4 tags,
  // split from the boot communicator by every rank in one fixed order at the first tagged
  // operation (before any rank can block on one: a pipeline's first tagged operation
  // comes before its first host wait).
  absl::Status MakeLinks() {
    links_made_ = true;
    cudaSetDevice(device_);
    const int n = size(), me = rank();
    for (int tag = 0; tag < kLinkTags; ++tag)
      for (int src = 0; src < n; ++src)
        for (int d : {1, -1}) {
          const int dst = ((src + d) % n + n) % n;
          if (dst == src || (d == -1 && n == 2)) continue;  // with 2 ranks, +1 and -1 are the same link
          const bool in = me == src || me == dst;
          // Blocking: the links' calls only enqueue; the watchdog aborts them with the parent.
          if (aborted_) return absl::AbortedError("communicator was aborted");
          absl::StatusOr<ncclComm_t> child =
              SplitBlocking(boot_, in ? 0 : NCCL_SPLIT_NOCOLOR, me == src ? 0 : 1, nullptr, timeout_ms_);
          if (!child.ok()) return child.status();
          if (!in) continue;
          LinkComm link;
          link.comm = *child;
          if (auto e = cudaStreamCreateWithFlags(&link.stream, cudaStreamNonBlocking); e != cudaSuccess)
            return CudaError(e, "cudaStreamCreate");
          links_[{src, dst, tag}] = link;
        }
    // Connect every link now, in the one order all ranks share: NCCL sets up a
    // point-to-point connection at its first send/receive, and on a blocking communicator
    // the call waits on the host for the peer to reach its side. Left to the schedule, two
    // ranks that both send first (the tied-embedding exchange) would wait for each other.
    void* warm = nullptr;
    if (auto e = cudaMalloc(&warm, 16); e != cudaSuccess) return CudaError(e, "cudaMalloc");
    auto connect = [&](const std::tuple<int, int, int>& key, LinkComm& link) -> absl::Status {
      const bool sender = std::get<0>(key) == me;
      absl::Status s = CheckOn(link.comm, sender ? ncclSend(warm, 1, ncclInt8, 1, link.comm, link.stream)
                                                 : ncclRecv(warm, 1, ncclInt8, 0, link.comm, link.stream));
      if (!s.ok()) return s;
      return WaitStream(link.stream, "link warm-up");
    };
    for (auto& [key, link] : links_) {  // std::map: (src, dst, tag) order on every rank
      absl::Status s = connect(key, link);
      if (!s.ok()) {
        cudaFree(warm);
        return s;
      }
    }
    cudaFree(warm);
    return absl::OkStatus();
  }
  // Waits for one stream under the watchdog's deadline (aborting everything past it).
  absl::Status WaitStream(cudaStream_t stream, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    while (true) {
      cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) return CudaError(q, what);
      if (std::chrono::steady_clock::now() > deadline) {
        const std::string busy = BusyStreams();
        Abort();
        return Describe(absl::DeadlineExceededError(absl::StrCat(what, " did not complete within ", timeout_ms_,
                                                                 " ms (still running: ", busy,
                                                                 "); communicator aborted")), "watchdog");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  absl::StatusOr<LinkComm*> Link(int src, int dst, int tag) {
    if (tag < 0 || tag >= kLinkTags)
      return absl::InvalidArgumentError(absl::StrCat("tagged messages carry tags 0..", kLinkTags - 1, ", got ", tag));
    if (!links_made_)
      if (absl::Status s = MakeLinks(); !s.ok()) return s;
    auto it = links_.find({src, dst, tag});
    if (it == links_.end())
      return absl::InvalidArgumentError(absl::StrCat("tagged messages go between ring neighbours only: ", src, " -> ",
                                                     dst, " of ", size(), " ranks"));
    return &it->second;
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
  absl::Status WaitForComputeOn(cudaStream_t s) {
    if (compute_ == nullptr) return absl::OkStatus();
    if (auto e = cudaEventRecord(before_, compute_); e != cudaSuccess) return CudaError(e, "cudaEventRecord");
    if (auto e = cudaStreamWaitEvent(s, before_, 0); e != cudaSuccess) return CudaError(e, "cudaStreamWaitEvent");
    return absl::OkStatus();
  }
  absl::Status ComputeWaitsFor(cudaStream_t s) {
    if (compute_ == nullptr) return absl::OkStatus();
    if (auto e = cudaEventRecord(after_, s); e != cudaSuccess) return CudaError(e, "cudaEventRecord");
    if (auto e = cudaStreamWaitEvent(compute_, after_, 0); e != cudaSuccess) return CudaError(e, "cudaStreamWaitEvent");
    return absl::OkStatus();
  }
  absl::Status ComputeWaits() { return overlap_ ? absl::OkStatus() : Join(); }
  template <typename F>
  absl::Status Ordered(F&& enqueue) {
    group_op_ = last_op(), group_seq_ = seq();
    Trace(last_op(), -1, -1);
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
  // Host values: copied up to the device, the collective, back down — all on this
  // communicator's stream, not ordered with the compute stream — then the watchdog's
  // wait. Nothing here may wait for the compute stream (the point of these calls: DP's
  // step start must not wait for the previous step's optimizer). So no pinned staging
  // (cudaFreeHost and cudaFree synchronize the whole device; the test hung
  // there): the copies go straight from and to the caller's pageable memory (a
  // pageable copy up is staged at once; the copy down waits for stream_ only), and the
  // device buffer grows stream-ordered (cudaMallocAsync / cudaFreeAsync).
  absl::Status DoAllReduceHost(const void* in, void* out, size_t n, DType t, ReduceOp op) override {
    if (in_group_) return absl::FailedPreconditionError("host collectives cannot be grouped");
    const size_t bytes = n * DTypeSize(t);
    if (absl::Status s = HostStaging(bytes); !s.ok()) return s;
    group_op_ = last_op(), group_seq_ = seq();
    if (auto e = cudaMemcpyAsync(host_dev_, in, bytes, cudaMemcpyHostToDevice, stream_); e != cudaSuccess)
      return CudaError(e, "all_reduce_host: copy up");
    if (absl::Status s = Check(ncclAllReduce(host_dev_, host_dev_, n, ToNccl(t), ToNccl(op), comm_, stream_)); !s.ok())
      return s;
    return HostStagingDown(out, bytes);
  }
  absl::Status DoAllGatherHost(const void* in, void* out, size_t n, DType t) override {
    if (in_group_) return absl::FailedPreconditionError("host collectives cannot be grouped");
    const size_t bytes = n * DTypeSize(t), total = bytes * size();
    if (absl::Status s = HostStaging(total); !s.ok()) return s;
    char* mine = static_cast<char*>(host_dev_) + bytes * rank();  // in place: this rank's slot
    group_op_ = last_op(), group_seq_ = seq();
    if (auto e = cudaMemcpyAsync(mine, in, bytes, cudaMemcpyHostToDevice, stream_); e != cudaSuccess)
      return CudaError(e, "all_gather_host: copy up");
    if (absl::Status s = Check(ncclAllGather(mine, host_dev_, n, ToNccl(t), comm_, stream_)); !s.ok()) return s;
    return HostStagingDown(out, total);
  }
  absl::Status HostStaging(size_t bytes) {
    if (bytes <= host_capacity_) return absl::OkStatus();
    const size_t want = std::max<size_t>(bytes, 2 * std::max<size_t>(host_capacity_, 2048));  // at least twofold
    // Stream-ordered: the old buffer is freed after the work already on stream_.
    if (host_dev_) cudaFreeAsync(host_dev_, stream_), host_dev_ = nullptr, host_capacity_ = 0;
    if (auto e = cudaMallocAsync(&host_dev_, want, stream_); e != cudaSuccess)
      return CudaError(e, "cudaMallocAsync(host collective staging)");
    host_capacity_ = want;
    return absl::OkStatus();
  }
  absl::Status HostStagingDown(void* out, size_t bytes) {
    // The watchdog's wait first: a copy to pageable memory returns only once it is done,
    // so issued before, a stuck collective would hang this thread past the timeout.
    if (absl::Status s = Synchronize(); !s.ok()) return s;
    if (auto e = cudaMemcpyAsync(out, host_dev_, bytes, cudaMemcpyDeviceToHost, stream_); e != cudaSuccess)
      return CudaError(e, "host collective: copy down");
    return absl::OkStatus();
  }
  absl::Status DoBarrier() override {
    if (!barrier_buf_) {
      if (auto e = cudaMalloc(&barrier_buf_, 4); e != cudaSuccess) return CudaError(e, "cudaMalloc");
    }
    group_op_ = last_op(), group_seq_ = seq();
    auto s = Check(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_, stream_));
    if (!s.ok()) return s;
    return Synchronize();
  }
  // Tagged point-to-point (pipelines): a message of (tag, src -> dst) travels over its own
  // two-rank communicator and stream, a "link" (NCCL matches messages per communicator in
  // issue order, whatever their tag, and serializes a communicator's operations: one
  // communicator would pair a pipeline's activations with its gradients, or hold a
  // receive behind a send that waits for it). A send waits for the compute before it
  // and nothing waits for the send until WaitSends; a receive waits for the compute
  // before it (its buffer) and the compute after waits for it. Each link stream only
  // sends or only receives, in order, so the schedule's own dependencies are the only
  // waits: any schedule that runs on Gloo runs here.
  absl::Status DoIsend(const void* buf, size_t n, DType t, int peer, int tag) override {
    TESSERA_NCCL_LINK_OR_RETURN(link, Link(rank(), peer, tag));
    if (absl::Status s = WaitForComputeOn(link->stream); !s.ok()) return s;
    link->last_op = "isend", link->last_seq = seq();
    Trace("isend", peer, tag);
    if (absl::Status s = CheckOn(link->comm, ncclSend(buf, n, ToNccl(t), 1, link->comm, link->stream)); !s.ok()) return s;
    link->pending = true;
    return absl::OkStatus();
  }
  absl::Status DoRecvTagged(void* buf, size_t n, DType t, int peer, int tag) override {
    TESSERA_NCCL_LINK_OR_RETURN(link, Link(peer, rank(), tag));
    if (absl::Status s = WaitForComputeOn(link->stream); !s.ok()) return s;
    link->last_op = "recv", link->last_seq = seq();
    Trace("recv", peer, tag);
    if (absl::Status s = CheckOn(link->comm, ncclRecv(buf, n, ToNccl(t), 0, link->comm, link->stream)); !s.ok()) return s;
    return ComputeWaitsFor(link->stream);
  }
  absl::Status DoWaitSends() override {
    for (auto& [key, link] : links_)
      if (link.pending) {
        if (absl::Status s = ComputeWaitsFor(link.stream); !s.ok()) return s;
        link.pending = false;
      }
    return absl::OkStatus();
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
  ncclComm_t boot_;  // non-blocking: the links are split from it
  ncclComm_t comm_;  // blocking: every collective and untagged send/receive
  cudaStream_t stream_;
  int device_;
  int64_t timeout_ms_;
  bool trace_;
  std::atomic<bool> aborted_{false};
  void* barrier_buf_ = nullptr;
  void* host_dev_ = nullptr;  // AllReduceHost / AllGatherHost staging, host_capacity_ bytes
  size_t host_capacity_ = 0;
  cudaStream_t compute_ = nullptr;  // OrderWith
  cudaEvent_t before_ = nullptr, after_ = nullptr;
  bool in_group_ = false;
  bool overlap_ = false;  // SetOverlap: compute waits at Join() only
  bool links_made_ = false;
  const char* group_op_ = "none";  // the last operation enqueued on stream_
  uint64_t group_seq_ = 0;
  std::map<std::tuple<int, int, int>, LinkComm> links_;  // (src, dst, tag) of tagged point-to-point
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
  // The collectives run on a blocking communicator split from the non-blocking one. On a
  // non-blocking communicator NCCL launches every group (each lone collective is one) from
  // a thread it creates for that call, and the caller polls until it is done: 93-115 us
  // of host time per collective against 17-19 us blocking (2x H200: 14-17 ms
  // against 2.6-2.9 ms a step for dp2's 151 calls), enough to starve the GPU where the
  // host is not far ahead (under CUPTI tracing, the last micro-batch's reductions). The init stays non-blocking, so a peer that never comes is a
  // timeout, not a hang; splits (the links too) go through it for the same reason. A
  // blocking enqueue does not wait for peers; a collective stuck on the GPU is the
  // watchdog's (Synchronize), which aborts both — what PyTorch's blocking default does.
  absl::StatusOr<ncclComm_t> work = SplitBlocking(comm, 0, rank, name.c_str(), opts.timeout_ms);
  if (!work.ok()) {
    ncclCommAbort(comm);
    return fail(absl::StrCat("the blocking communicator: ", work.status().message()));
  }
  cudaStream_t stream;
  if (auto e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess)
    return fail(absl::StrCat("cudaStreamCreate: ", cudaGetErrorString(e)));
  return std::unique_ptr<Communicator>(
      std::make_unique<NcclCommunicator>(name, rank, size, comm, *work, stream, opts.device, opts.timeout_ms, opts.trace));
}

}  // namespace tessera::comm
