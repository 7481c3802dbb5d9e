// The CUDA backend: stream-ordered allocations from the device's memory pool
// (cudaMallocAsync; a graph capture's from the backend's capture arena) with accounting
// and a peak report, one stream per backend, and
// the CUDA kernels of kernels/<op>/*.cu (cuBLASLt for GEMM).
#include "kernels/gemm/cublaslt_loader.h"
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/adamw/adamw.h"
#include "kernels/attention/attention.h"

#include <cmath>
#include "kernels/cast/cast.h"
#include "kernels/common/cuda_arch.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/reduce/reduce.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/rope/rope.h"
#include "kernels/sampling/sampling.h"
#include "kernels/gemm/gemm.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/swiglu/swiglu.h"
#include "worker/runtime/backend.h"
#include "worker/runtime/capture_arena.h"

namespace tessera::runtime {
namespace {

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

// Stream-ordered blocks of the device's pool; while a capture runs, blocks of the
// backend's capture arena instead (worker/runtime/capture_arena.h: no memory nodes in the
// graph, so its kernels keep their programmatic edges). An arena block freed after the
// capture goes back to the arena, whenever that is.
class PoolAllocator final : public Allocator {
 public:
  PoolAllocator(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* p = nullptr;
    cudaSetDevice(device_);
    if (std::shared_ptr<CaptureArena> arena = Capturing()) {
      absl::StatusOr<void*> a = arena->Allocate(bytes);
      if (!a.ok()) {
        auto st = account_.stats();
        return absl::ResourceExhaustedError(absl::StrCat("cuda:", device_, ": cannot allocate ", bytes,
                                                         " bytes for a graph capture (", a.status().message(),
                                                         "); in use ", st.current_bytes, ", peak ", st.peak_bytes));
      }
      account_.Add(bytes);
      return *a;
    }
    cudaError_t e = cudaMallocAsync(&p, std::max<size_t>(bytes, 1), stream_);
    if (e != cudaSuccess) {
      cudaGetLastError();
      auto st = account_.stats();
      return absl::ResourceExhaustedError(absl::StrCat("cuda:", device_, ": cannot allocate ", bytes, " bytes (",
                                                       cudaGetErrorString(e), "); in use ", st.current_bytes,
                                                       ", peak ", st.peak_bytes));
    }
    account_.Add(bytes);
    return p;
  }
  void Free(void* p, size_t bytes) override {
    account_.Sub(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (arena_ != nullptr && arena_->Free(p)) return;
    }
    cudaFreeAsync(p, stream_);
  }
  Device device() const override { return Device::Cuda(device_); }
  MemoryStats stats() const override { return account_.stats(); }
  void ResetPeak() override { account_.ResetPeak(); }

  // The arena the capture that starts now takes its blocks from (made at the first capture).
  std::shared_ptr<CaptureArena> BeginCapture() {
    std::lock_guard<std::mutex> lock(mu_);
    if (arena_ == nullptr) {
      const int device = device_;
      arena_ = std::make_shared<CaptureArena>(
          [device](size_t n) -> absl::StatusOr<void*> {
            void* p = nullptr;
            cudaSetDevice(device);
            const cudaError_t e = cudaMalloc(&p, n);
            if (e != cudaSuccess) {
              cudaGetLastError();
              return absl::ResourceExhaustedError(absl::StrCat("cudaMalloc of a ", n, "-byte chunk: ", cudaGetErrorString(e)));
            }
            return p;
          },
          [](void* p) { cudaFree(p); });
    }
    capturing_ = true;
    return arena_;
  }
  void EndCapture() {
    std::lock_guard<std::mutex> lock(mu_);
    capturing_ = false;
  }

 private:
  std::shared_ptr<CaptureArena> Capturing() {
    std::lock_guard<std::mutex> lock(mu_);
    return capturing_ ? arena_ : nullptr;
  }

  int device_;
  cudaStream_t stream_;
  MemoryAccount account_;
  std::mutex mu_;
  bool capturing_ = false;
  std::shared_ptr<CaptureArena> arena_;
};

// A kernel's scratch (kernels/common/scratch.h) from the backend's allocator: under graph
// capture, arena blocks instead of allocation nodes between the kernels.
class AllocatorScratch final : public kernels::DeviceScratch {
 public:
  explicit AllocatorScratch(Allocator* a) : a_(a) {}
  void* Get(size_t bytes) override {
    absl::StatusOr<void*> p = a_->Allocate(bytes);
    return p.ok() ? *p : nullptr;
  }
  void Put(void* p, size_t bytes) override { a_->Free(p, bytes); }

 private:
  Allocator* a_;
};

// uniform_len is known only from host cu_seqlens (already validated by Backend).
kernels::AttentionDims AttnDims(const Tensor& q, const Tensor& k, const Tensor& cu, bool causal,
                                kernels::AttentionEngine engine) {
  kernels::AttentionDims d{q.dim(0), q.dim(1), k.dim(1), q.dim(2), cu.dim(0) - 1, causal,
                           static_cast<float>(1.0 / std::sqrt(double(q.dim(2))))};
  d.engine = engine;
  if (cu.device().kind == runtime::DeviceKind::kCpu && d.batch > 0) {
    const int32_t* h = cu.data_as<int32_t>();
    const int64_t len = h[1] - h[0];
    bool same = true;
    for (int64_t i = 1; same && i < d.batch; ++i) same = h[i + 1] - h[i] == len;
    if (same) d.uniform_len = len;
  }
  return d;
}

// An instantiated graph, with the arena whose blocks its kernels address.
class CudaGraph final : public Backend::Graph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream, std::shared_ptr<CaptureArena> arena, Shape shape)
      : exec_(exec), stream_(stream), arena_(std::move(arena)), shape_(shape) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  absl::Status Launch() override { return Cuda(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch"); }
  Shape shape() const override { return shape_; }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  std::shared_ptr<CaptureArena> arena_;
  Shape shape_;
};

// The nodes and edges of a captured graph, by kind.
absl::StatusOr<Backend::Graph::Shape> ShapeOf(cudaGraph_t graph) {
  Backend::Graph::Shape shape;
  size_t n = 0;
  TESSERA_RETURN_IF_ERROR(Cuda(cudaGraphGetNodes(graph, nullptr, &n), "cudaGraphGetNodes"));
  std::vector<cudaGraphNode_t> nodes(n);
  TESSERA_RETURN_IF_ERROR(Cuda(cudaGraphGetNodes(graph, nodes.data(), &n), "cudaGraphGetNodes"));
  shape.nodes = static_cast<int>(n);
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    TESSERA_RETURN_IF_ERROR(Cuda(cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType"));
    shape.kernels += type == cudaGraphNodeTypeKernel;
    shape.memory_nodes += type == cudaGraphNodeTypeMemAlloc || type == cudaGraphNodeTypeMemFree;
  }
  size_t e = 0;
  TESSERA_RETURN_IF_ERROR(Cuda(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &e), "cudaGraphGetEdges"));
  std::vector<cudaGraphNode_t> from(e), to(e);
  std::vector<cudaGraphEdgeData> data(e);
  TESSERA_RETURN_IF_ERROR(Cuda(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &e), "cudaGraphGetEdges"));
  shape.edges = static_cast<int>(e);
  for (size_t i = 0; i < e; ++i) shape.programmatic_edges += data[i].type == cudaGraphDependencyTypeProgrammatic;
  return shape;
}

class StreamEvent final : public Backend::Event {
 public:
  StreamEvent(cudaEvent_t e, cudaStream_t stream, int device) : e_(e), stream_(stream), device_(device) {}
  ~StreamEvent() override { cudaEventDestroy(e_); }
  absl::Status Record() override {
    cudaSetDevice(device_);
    return Cuda(cudaEventRecord(e_, stream_), "cudaEventRecord");
  }
  absl::Status Wait() override {
    cudaSetDevice(device_);
    return Cuda(cudaEventSynchronize(e_), "cudaEventSynchronize");
  }

 private:
  cudaEvent_t e_;
  cudaStream_t stream_;
  int device_;
};

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<Backend>> Create(int device) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || device >= n) {
      cudaGetLastError();
      return absl::UnavailableError(absl::StrCat("no CUDA device ", device, " (", n, " visible)"));
    }
    // A GPU the kernels were not built for is refused here, by name, not at a job's first kernel.
    cudaDeviceProp prop{};
    if (auto s = Cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"); !s.ok()) return s;
    TESSERA_RETURN_IF_ERROR(kernels::CheckComputeCapability(kernels::BuiltCudaArchitectures(), device, prop.name, prop.major, prop.minor));
    auto b = std::unique_ptr<CudaBackend>(new CudaBackend());
    b->device_ = device;
    if (auto s = Cuda(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
    if (auto s = Cuda(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking), "cudaStreamCreate"); !s.ok()) return s;
    // Keep freed memory in the pool instead of returning it to the driver at every sync.
    cudaMemPool_t pool;
    cudaDeviceGetDefaultMemPool(&pool, device);
    uint64_t threshold = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    b->alloc_ = std::make_unique<PoolAllocator>(device, b->stream_);
    b->scratch_ = std::make_unique<AllocatorScratch>(b->alloc_.get());
    auto api = kernels::GetCublasLt();
    if (!api.ok()) return api.status();
    if ((*api)->Create(reinterpret_cast<cublasLtHandle_t*>(&b->lt_)) != CUBLAS_STATUS_SUCCESS)
      return absl::InternalError("cublasLtCreate failed");
    if (auto s = Cuda(cudaMalloc(&b->workspace_, kWorkspace), "cudaMalloc(workspace)"); !s.ok()) return s;
    return std::unique_ptr<Backend>(std::move(b));
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    for (size_t i = 0; i < sides_made_; ++i) {
      cudaStreamSynchronize(sides_[i].stream);
      cudaFree(sides_[i].workspace);
      cudaEventDestroy(sides_[i].done);
      cudaStreamDestroy(sides_[i].stream);
    }
    if (fork_) cudaEventDestroy(fork_);
    if (workspace_) cudaFree(workspace_);
    if (lt_) (*kernels::GetCublasLt())->Destroy(static_cast<cublasLtHandle_t>(lt_));  // loaded: lt_ exists
    alloc_.reset();
    cudaStreamDestroy(stream_);
  }
  Device device() const override { return Device::Cuda(device_); }
  Allocator* allocator() override { return alloc_.get(); }
  void* stream() const override { return stream_; }
  absl::Status BeginCapture() override {
    cudaSetDevice(device_);
    capture_arena_ = alloc_->BeginCapture();
    // Relaxed: a first-use library call (e.g. a lazy cudaMalloc, or a new arena chunk)
    // does not invalidate the capture; the ops themselves are all stream-ordered.
    const absl::Status s = Cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
    if (!s.ok()) alloc_->EndCapture(), capture_arena_.reset();
    return s;
  }
  absl::StatusOr<std::unique_ptr<Graph>> EndCapture() override {
    alloc_->EndCapture();
    std::shared_ptr<CaptureArena> arena = std::move(capture_arena_);
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    if (e != cudaSuccess || graph == nullptr) {
      cudaGetLastError();  // the capture was invalidated: clear the sticky error of the failed call
      if (graph != nullptr) cudaGraphDestroy(graph);
      return absl::InternalError(absl::StrCat("cuda graph capture failed: ", cudaGetErrorString(e)));
    }
    absl::StatusOr<Graph::Shape> shape = ShapeOf(graph);
    cudaGraphExec_t exec = nullptr;
    const cudaError_t ie = shape.ok() ? cudaGraphInstantiate(&exec, graph, 0) : cudaSuccess;
    cudaGraphDestroy(graph);
    if (!shape.ok()) return shape.status();
    if (ie != cudaSuccess) {
      cudaGetLastError();
      return absl::InternalError(absl::StrCat("cudaGraphInstantiate: ", cudaGetErrorString(ie)));
    }
    return std::unique_ptr<Graph>(new CudaGraph(exec, stream_, std::move(arena), *shape));
  }
  absl::Status Synchronize() override { return Cuda(cudaStreamSynchronize(stream_), "synchronize"); }
  // The side streams' workspaces are made first: what a cache is then sized to stays free
  // of the backend's own buffers.
  absl::StatusOr<DeviceMemory> MemoryInfo() override {
    cudaSetDevice(device_);
    TESSERA_RETURN_IF_ERROR(MakeSides(kSides));
    TESSERA_RETURN_IF_ERROR(Synchronize());
    cudaMemPool_t pool;
    TESSERA_RETURN_IF_ERROR(Cuda(cudaDeviceGetDefaultMemPool(&pool, device_), "cudaDeviceGetDefaultMemPool"));
    TESSERA_RETURN_IF_ERROR(Cuda(cudaMemPoolTrimTo(pool, 0), "cudaMemPoolTrimTo"));
    size_t free = 0, total = 0;
    TESSERA_RETURN_IF_ERROR(Cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo"));
    return DeviceMemory{static_cast<int64_t>(total), static_cast<int64_t>(free)};
  }
  // Events are kept for reuse across ClearMarks (a pipeline step records two per op).
  absl::StatusOr<int> Mark() override {
    if (used_marks_ == events_.size()) {
      cudaEvent_t e;
      TESSERA_RETURN_IF_ERROR(Cuda(cudaEventCreate(&e), "cudaEventCreate"));
      events_.push_back(e);
    }
    TESSERA_RETURN_IF_ERROR(Cuda(cudaEventRecord(events_[used_marks_], stream_), "cudaEventRecord"));
    return static_cast<int>(used_marks_++);
  }
  absl::StatusOr<double> Seconds(int a, int b) override {
    const int n = static_cast<int>(used_marks_);
    if (a < 0 || b < 0 || a >= n || b >= n)
      return absl::OutOfRangeError(absl::StrCat("timing marks ", a, " and ", b, ": only ", n, " marks"));
    TESSERA_RETURN_IF_ERROR(Cuda(cudaEventSynchronize(events_[b]), "cudaEventSynchronize"));
    float ms = 0;
    TESSERA_RETURN_IF_ERROR(Cuda(cudaEventElapsedTime(&ms, events_[a], events_[b]), "cudaEventElapsedTime"));
    return ms / 1e3;
  }
  void ClearMarks() override { used_marks_ = 0; }
  // The backend's device is made current first: a call may come on any thread (an
  // executor's RPC threads), and a copy on this device's stream from another device fails.
  absl::Status CopyFromHost(const void* src, Tensor& dst) override {
    cudaSetDevice(device_);
    const cudaError_t e = cudaMemcpyAsync(dst.data(), src, dst.nbytes(), cudaMemcpyHostToDevice, stream_);
    return e == cudaSuccess ? absl::OkStatus() : CopyFailure("copy to device", e, dst.data(), dst.nbytes());
  }
  absl::Status CopyToHost(const Tensor& src, void* dst) override {
    cudaSetDevice(device_);
    const cudaError_t e = cudaMemcpyAsync(dst, src.data(), src.nbytes(), cudaMemcpyDeviceToHost, stream_);
    return e == cudaSuccess ? Synchronize() : CopyFailure("copy to host", e, src.data(), src.nbytes());
  }
  absl::Status CopyToHostAsync(const Tensor& src, void* dst) override {
    cudaSetDevice(device_);
    const cudaError_t e = cudaMemcpyAsync(dst, src.data(), src.nbytes(), cudaMemcpyDeviceToHost, stream_);
    return e == cudaSuccess ? absl::OkStatus() : CopyFailure("copy to host", e, src.data(), src.nbytes());
  }
  absl::StatusOr<std::unique_ptr<Event>> NewEvent() override {
    cudaSetDevice(device_);
    cudaEvent_t e;
    TESSERA_RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
    return std::unique_ptr<Event>(new StreamEvent(e, stream_, device_));
  }
  // What a failed host copy's device side was: its address, size and memory kind, and the
  // current device against this backend's.
  absl::Status CopyFailure(const char* what, cudaError_t e, const void* p, size_t bytes) const {
    cudaGetLastError();
    cudaPointerAttributes a{};
    const bool known = cudaPointerGetAttributes(&a, p) == cudaSuccess;
    cudaGetLastError();
    int current = -1;
    cudaGetDevice(&current);
    return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e), " (", bytes, " bytes at ",
                                            absl::Hex(reinterpret_cast<uintptr_t>(p)), ": ",
                                            known ? absl::StrCat("memory type ", static_cast<int>(a.type), " of device ", a.device)
                                                  : std::string("no CUDA allocation"),
                                            "; current device ", current, ", the backend's ", device_, ")"));
  }
  absl::StatusOr<HostBuffer> AllocHostStaging(size_t bytes) override {
    void* p = nullptr;
    if (cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocDefault) != cudaSuccess)
      return absl::ResourceExhaustedError(absl::StrCat("page-locked host memory of ", bytes, " bytes: ",
                                                       cudaGetErrorString(cudaGetLastError())));
    return HostBuffer(static_cast<char*>(p), [](char* q) { cudaFreeHost(q); });
  }
  absl::Status Fill(Tensor& t, uint8_t byte) override {
    cudaSetDevice(device_);  // as the host copies: the caller's thread may have another device current
    return Cuda(cudaMemsetAsync(t.data(), byte, t.nbytes(), stream_), "memset");
  }

 protected:
  absl::Status DoCopy2D(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t row_bytes,
                        int64_t rows) override {
    cudaSetDevice(device_);
    return Cuda(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice, stream_),
                "copy on the device");
  }
  absl::Status DoCast(const Tensor& x, Tensor& y) override {
    return kernels::CastCuda(x.data(), x.dtype(), y.data(), y.dtype(), x.numel(), stream_);
  }
  absl::Status DoRmsNormForward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) override {
    return kernels::RmsNormForwardCuda(x.data(), w.data(), y.data(), rstd.data_as<float>(), x.dim(0), x.dim(1), eps,
                                       x.dtype(), stream_);
  }
  absl::Status DoRmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                                 Tensor& dw, const Tensor* add) override {
    return kernels::RmsNormBackwardCuda(dy.data(), x.data(), w.data(), rstd.data_as<float>(), dx.data(),
                                        dw.data_as<float>(), x.dim(0), x.dim(1), x.dtype(), stream_,
                                        add != nullptr ? add->data() : nullptr);
  }
  absl::Status DoSwiGluForward(const Tensor& g, const Tensor& u, Tensor& y) override {
    return kernels::SwiGluForwardCuda(g.data(), u.data(), y.data(), g.numel(), g.dtype(), stream_);
  }
  absl::Status DoSwiGluBackward(const Tensor& dy, const Tensor& g, const Tensor& u, Tensor& dg, Tensor& du,
                                Tensor* y) override {
    return kernels::SwiGluBackwardCuda(dy.data(), g.data(), u.data(), dg.data(), du.data(), g.numel(), g.dtype(), stream_,
                                       y != nullptr ? y->data() : nullptr);
  }
  absl::Status DoGemm(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha, float beta,
                      const Tensor* c_in) override {
    return RunGemm(a, ta, b, tb, c, alpha, beta, c_in, stream_, workspace_);
  }
  // One checked GEMM on `on` with workspace `ws` (kWorkspace bytes).
  absl::Status RunGemm(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha, float beta,
                       const Tensor* c_in, cudaStream_t on, void* ws) {
    const int64_t m = c.dim(0), n = c.dim(1), k = ta ? a.dim(0) : a.dim(1);
    return kernels::GemmCuda(a.data(), ta, b.data(), tb, c.data(), m, n, k, alpha, beta, a.dtype(), c.dtype(), lt_, ws,
                             kWorkspace, on, c_in != nullptr ? c_in->data() : nullptr);
  }
  // The first call on the backend's stream, the others each on a side stream of its own
  // (made at the first such call, with its own workspace: the same plans as alone), forked
  // after the work before and joined before the work after — also under a capture, where
  // the fork and the join become the graph's edges. Only GEMMs of few rows (a decode step's
  // batch) run at once: larger ones fill the GPU alone (H200, a 1B Llama's decode step:
  // 64 rows 1.487 -> 1.406 ms with q/k/v and gate/up at once, 256 rows 2.333 -> 2.359).
  absl::Status DoGemms(absl::Span<const GemmCall> calls) override {
    if (calls.size() < 2 || calls.size() > 1 + kSides || calls[0].c->dim(0) > kConcurrentRows) return Backend::DoGemms(calls);
    cudaSetDevice(device_);
    TESSERA_RETURN_IF_ERROR(MakeSides(calls.size() - 1));
    if (fork_ == nullptr)
      TESSERA_RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "cudaEventCreate(fork)"));
    TESSERA_RETURN_IF_ERROR(Cuda(cudaEventRecord(fork_, stream_), "cudaEventRecord(fork)"));
    size_t forked = 0;  // side streams that wait for the fork: each is joined back, whatever fails
    absl::Status st = absl::OkStatus();
    for (; forked + 1 < calls.size() && st.ok(); ++forked)
      st = Cuda(cudaStreamWaitEvent(sides_[forked].stream, fork_, 0), "cudaStreamWaitEvent(fork)");
    for (size_t i = 0; i < calls.size() && st.ok(); ++i) {
      const GemmCall& g = calls[i];
      st = RunGemm(*g.a, g.ta, *g.b, g.tb, *g.c, 1.f, 0.f, nullptr, i == 0 ? stream_ : sides_[i - 1].stream,
                   i == 0 ? workspace_ : sides_[i - 1].workspace);
    }
    for (size_t i = 0; i < forked; ++i) {
      absl::Status j = Cuda(cudaEventRecord(sides_[i].done, sides_[i].stream), "cudaEventRecord(join)");
      if (j.ok()) j = Cuda(cudaStreamWaitEvent(stream_, sides_[i].done, 0), "cudaStreamWaitEvent(join)");
      if (st.ok()) st = j;
    }
    return st;
  }
  // Side streams of DoGemms up to n, each with its own event and workspace.
  absl::Status MakeSides(size_t n) {
    while (sides_made_ < n) {
      Side sd;
      absl::Status made = Cuda(cudaStreamCreateWithFlags(&sd.stream, cudaStreamNonBlocking), "cudaStreamCreate(side)");
      if (made.ok()) made = Cuda(cudaEventCreateWithFlags(&sd.done, cudaEventDisableTiming), "cudaEventCreate(side)");
      if (made.ok()) made = Cuda(cudaMalloc(&sd.workspace, kWorkspace), "cudaMalloc(side workspace)");
      if (!made.ok()) {
        if (sd.done != nullptr) cudaEventDestroy(sd.done);
        if (sd.stream != nullptr) cudaStreamDestroy(sd.stream);
        return made;
      }
      sides_[sides_made_++] = sd;
    }
    return absl::OkStatus();
  }
  absl::Status DoEmbeddingForward(const Tensor& ids, const Tensor& table, int64_t vs, Tensor& out) override {
    return kernels::EmbeddingForwardCuda(ids.data_as<int32_t>(), table.data(), out.data(), ids.dim(0), table.dim(0),
                                        table.dim(1), vs, table.dtype(), stream_);
  }
  absl::Status DoEmbeddingBackward(const Tensor& ids, const Tensor& dout, int64_t vs, Tensor& dtable) override {
    return kernels::EmbeddingBackwardCuda(ids.data_as<int32_t>(), dout.data(), dtable.data_as<float>(), ids.dim(0),
                                         dtable.dim(0), dtable.dim(1), vs, dout.dtype(), stream_);
  }
  absl::Status DoRope(const Tensor& x, const Tensor& pos, const float* inv_freq, float scale, Tensor& y,
                      float sign) override {
    return kernels::RopeCuda(x.data(), pos.data_as<int32_t>(), y.data(), x.dim(0), x.dim(1), x.dim(2), inv_freq, scale, sign,
                            x.dtype(), stream_, x.strides()[0], y.strides()[0]);
  }
  absl::Status DoCrossEntropyPartials(const Tensor& z, const Tensor& t, int64_t vs, Tensor& mx, Tensor& sm, Tensor& dt,
                                      Tensor& tg) override {
    return kernels::CrossEntropyPartialsCuda(z.data(), t.data_as<int32_t>(), mx.data_as<float>(), sm.data_as<float>(),
                                            dt.data_as<float>(), tg.data_as<float>(), z.dim(0), z.dim(1), vs, z.dtype(), stream_);
  }
  absl::Status DoCrossEntropyRescale(const Tensor& mx, const Tensor& gmx, Tensor& sm) override {
    return kernels::CrossEntropyRescaleCuda(mx.data_as<float>(), gmx.data_as<float>(), sm.data_as<float>(), mx.numel(), stream_);
  }
  absl::Status DoCrossEntropyLoss(const Tensor& mx, const Tensor& sm, const Tensor& tg, const Tensor& t, float scale,
                                  Tensor& lse, Tensor& dl, Tensor& loss) override {
    return kernels::CrossEntropyLossCuda(mx.data_as<float>(), sm.data_as<float>(), tg.data_as<float>(), t.data_as<int32_t>(),
                                        scale, lse.data_as<float>(), dl.data_as<float>(), loss.data_as<float>(), mx.numel(), stream_);
  }
  absl::Status DoCrossEntropyBackward(const Tensor& z, const Tensor& t, int64_t vs, const Tensor& lse, const Tensor& dl,
                                      Tensor& dz, const Tensor* dh, const Tensor* h) override {
    return kernels::CrossEntropyBackwardCuda(z.data(), t.data_as<int32_t>(), lse.data_as<float>(), dl.data_as<float>(),
                                            dz.data(), z.dim(0), z.dim(1), vs, z.dtype(), stream_,
                                            dh ? dh->data_as<float>() : nullptr, h ? h->data_as<float>() : nullptr);
  }
  absl::Status DoSumSquares(const Tensor& x, Tensor& out) override {
    return kernels::SumSquaresCuda(x.data(), x.numel(), x.dtype(), out.data_as<float>(), stream_);
  }
  absl::Status DoScale(Tensor& x, float s) override { return kernels::ScaleCuda(x.data(), x.numel(), s, x.dtype(), stream_); }
  absl::Status DoAxpby(float alpha, const Tensor& x, float beta, Tensor& y) override {
    return kernels::AxpbyCuda(alpha, x.data(), x.dtype(), beta, y.data(), y.dtype(), x.numel(), stream_);
  }
  absl::Status DoAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu, bool causal,
                                  Tensor& out, Tensor& lse) override {
    TESSERA_ASSIGN_OR_RETURN(Tensor dcu, OnDevice(cu));
    return kernels::AttentionForwardCuda(q.data(), k.data(), v.data(), dcu.data_as<int32_t>(), out.data(), lse.data_as<float>(),
                                         AttnDims(q, k, cu, causal, attention_engine_), q.dtype(), stream_);
  }
  absl::Status DoPrepareAttention(int64_t batch, int64_t seq, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                                  bool causal, DType dtype) override {
    kernels::AttentionDims d{batch * seq, q_heads, kv_heads, head_dim, batch, causal,
                             static_cast<float>(1.0 / std::sqrt(double(head_dim)))};
    d.engine = attention_engine_;
    d.uniform_len = seq;
    cudaSetDevice(device_);
    return kernels::AttentionPrepareCuda(d, dtype, stream_);
  }
  absl::Status DoAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu, bool causal,
                                   const Tensor& out, const Tensor& dout, const Tensor& lse, Tensor& dq, Tensor& dk,
                                   Tensor& dv) override {
    TESSERA_ASSIGN_OR_RETURN(Tensor dcu, OnDevice(cu));
    return kernels::AttentionBackwardCuda(q.data(), k.data(), v.data(), dcu.data_as<int32_t>(), out.data(), dout.data(),
                                          lse.data_as<float>(), dq.data(), dk.data(), dv.data(), AttnDims(q, k, cu, causal, attention_engine_),
                                          q.dtype(), stream_);
  }
  absl::Status DoAttentionMerge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) override {
    return kernels::AttentionMergeCuda(out.data(), lse.data_as<float>(), out_b.data(), lse_b.data_as<float>(),
                                       out.dim(0) * out.dim(1), out.dim(2), out.dtype(), stream_);
  }
  // A host tensor is copied into stream-ordered device memory (the copy is ordered before
  // the kernels that read it, and the temporary is freed after them); a device tensor is
  // returned as is.
  absl::StatusOr<Tensor> OnDevice(const Tensor& t) {
    if (t.device() == device()) return t;
    TESSERA_ASSIGN_OR_RETURN(Tensor d, Empty(t.shape(), t.dtype()));
    TESSERA_RETURN_IF_ERROR(CopyFromHost(t.data(), d));
    return d;
  }
  absl::Status DoSample(const Tensor& z, const Tensor& temp, const Tensor& k, const Tensor& p, const Tensor& seed,
                        const Tensor& offset, Tensor& token, Tensor& logprob) override {
    kernels::SampleArgs a{temp.data_as<float>(), k.data_as<int32_t>(), p.data_as<float>(), seed.data_as<uint64_t>(),
                          offset.data_as<uint64_t>()};
    return kernels::SampleCuda(z.data(), z.dim(0), z.dim(1), z.dtype(), a, token.data_as<int32_t>(), logprob.data_as<float>(), stream_,
                               scratch_.get());
  }
  absl::Status DoPagedAttention(const Tensor& q, const Tensor& kc, const Tensor& vc, const Tensor& bt, const Tensor& cl,
                                Tensor& out, Tensor& lse) override {
    TESSERA_ASSIGN_OR_RETURN(Tensor dbt, OnDevice(bt));
    TESSERA_ASSIGN_OR_RETURN(Tensor dcl, OnDevice(cl));
    return kernels::PagedAttentionCuda(q.data(), kc.data(), vc.data(), dbt.data_as<int32_t>(), dcl.data_as<int32_t>(), out.data(),
                                      lse.data_as<float>(), kernels::PagedDims{q.dim(0), q.dim(1), kc.dim(2), q.dim(2), kc.dim(1), bt.dim(1), static_cast<float>(1.0 / std::sqrt(double(q.dim(2))))}, q.dtype(), stream_,
                                      scratch_.get());
  }
  absl::Status DoKvCacheWrite(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& kc, Tensor& vc) override {
    TESSERA_ASSIGN_OR_RETURN(Tensor ds, OnDevice(slots));
    return kernels::KvCacheWriteCuda(k.data(), v.data(), ds.data_as<int32_t>(), kc.data(), vc.data(), k.dim(0),
                                     k.nbytes() / std::max<int64_t>(k.dim(0), 1), stream_);
  }
  absl::Status DoSelect(const Tensor& src, const Tensor& from, const Tensor& values, Tensor& out) override {
    TESSERA_ASSIGN_OR_RETURN(Tensor ds, OnDevice(src));
    return kernels::SelectCuda(ds.data_as<int32_t>(), from.data_as<int32_t>(), values.data_as<int32_t>(),
                               out.data_as<int32_t>(), out.numel(), stream_);
  }
  // A share of L2 (TESSERA_DECODE_L2_WARM_PCT percent, default kDecodeWarmPct: 0, the
  // warming off until it is measured to pay), found once.
  int64_t DecodeWarmBytes() const override {
    std::call_once(warm_once_, [this] {
      int l2 = 0;
      if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_) != cudaSuccess) (void)cudaGetLastError(), l2 = 0;
      int64_t pct = kDecodeWarmPct;
      if (const char* e = std::getenv("TESSERA_DECODE_L2_WARM_PCT"); e != nullptr && *e != '\0')
        pct = std::clamp<int64_t>(std::strtol(e, nullptr, 10), 0, 100);
      warm_bytes_ = int64_t(l2) * pct / 100;
    });
    return warm_bytes_;
  }
  bool DecodeLinearSupported(int64_t rows, int64_t k, DType t) const override {
    return kernels::DecodeLinearCudaSupported(rows, k, t);
  }
  absl::Status DoDecodeLinear(const kernels::DecodeLinearArgs& a, DType t) override {
    return kernels::DecodeLinearCuda(a, t, stream_, scratch_.get());
  }
  absl::Status DoQkRopeCache(const kernels::QkRopeCacheArgs& a, DType t, const Tensor&, const Tensor& slots) override {
    TESSERA_ASSIGN_OR_RETURN(Tensor ds, OnDevice(slots));
    kernels::QkRopeCacheArgs d = a;
    d.slots = ds.data_as<int32_t>();
    return kernels::QkRopeCacheCuda(d, t, stream_);
  }
  absl::Status DoDecodeAttention(const kernels::QkRopeCacheArgs& a, DType t, const Tensor& positions, const Tensor& slots,
                                 const Tensor& q_out, const Tensor& kc, const Tensor& vc, const Tensor& bt, const Tensor& cl,
                                 Tensor& out, Tensor& lse, absl::Span<const kernels::L2Range> warm) override {
    const kernels::PagedDims d{a.tokens, a.q_heads, a.kv_heads, a.head_dim, kc.dim(1), bt.dim(1),
                               static_cast<float>(1.0 / std::sqrt(double(a.head_dim)))};
    if (!kernels::PagedAttentionRopeCudaSupported(d, t))
      return Backend::DoDecodeAttention(a, t, positions, slots, q_out, kc, vc, bt, cl, out, lse, warm);
    TESSERA_ASSIGN_OR_RETURN(Tensor ds, OnDevice(slots));
    TESSERA_ASSIGN_OR_RETURN(Tensor dbt, OnDevice(bt));
    TESSERA_ASSIGN_OR_RETURN(Tensor dcl, OnDevice(cl));
    kernels::PagedRopeArgs r;
    r.k_new = a.k, r.v_new = a.v, r.pos = a.pos, r.slots = ds.data_as<int32_t>();
    r.q_norm = a.q_norm, r.k_norm = a.k_norm, r.eps = a.eps, r.inv_freq = a.inv_freq, r.scale = a.scale;
    for (size_t i = 0; i < warm.size() && i < size_t(kernels::kMaxL2Warm); ++i) r.warm[i] = warm[i];
    return kernels::PagedAttentionRopeCuda(a.q, r, a.k_cache, a.v_cache, dbt.data_as<int32_t>(), dcl.data_as<int32_t>(),
                                           out.data(), lse.data_as<float>(), d, t, stream_, scratch_.get());
  }
  absl::Status DoAdamW(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWParams& a, Tensor* lowp) override {
    return kernels::AdamWCuda(p.data_as<float>(), g.data(), g.dtype(), m.data_as<float>(), v.data_as<float>(),
                              lowp ? lowp->data_as<uint16_t>() : nullptr, p.numel(),
                              {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step, a.grad_scale}, stream_);
  }

 private:
  static constexpr size_t kWorkspace = 32 << 20;
  static constexpr int64_t kDecodeWarmPct = 0;
  int device_ = 0;
  mutable std::once_flag warm_once_;
  mutable int64_t warm_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<PoolAllocator> alloc_;
  std::unique_ptr<AllocatorScratch> scratch_;  // over alloc_
  std::shared_ptr<CaptureArena> capture_arena_;  // while a capture runs
  void* lt_ = nullptr;
  void* workspace_ = nullptr;
  struct Side {  // a side stream of DoGemms
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;
    void* workspace = nullptr;
  };
  static constexpr size_t kSides = 2;
  static constexpr int64_t kConcurrentRows = 128;
  Side sides_[kSides];
  size_t sides_made_ = 0;
  cudaEvent_t fork_ = nullptr;
  std::vector<cudaEvent_t> events_;  // timing marks; the first used_marks_ are recorded
  size_t used_marks_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device) { return CudaBackend::Create(device); }

}  // namespace tessera::runtime
