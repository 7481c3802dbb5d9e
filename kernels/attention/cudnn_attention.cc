// cuDNN's fused flash attention as the forward's second path (see cudnn_attention.h).
// Host code only; the one small kernel (StatsToTokenMajor) is in attention_cuda.cu.
#include "kernels/attention/cudnn_attention.h"

#include <cudnn_graph.h>
#include <dlfcn.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera::kernels::cudnn_attention {
namespace {

// The cuDNN entry points we call, resolved from the loaded library (never linked).
struct Api {
  decltype(&cudnnGetVersion) GetVersion;
  decltype(&cudnnCreate) Create;
  decltype(&cudnnSetStream) SetStream;
  decltype(&cudnnGetErrorString) ErrorString;
  decltype(&cudnnGetLastErrorString) LastError;
  decltype(&cudnnBackendCreateDescriptor) CreateDesc;
  decltype(&cudnnBackendDestroyDescriptor) DestroyDesc;
  decltype(&cudnnBackendSetAttribute) Set;
  decltype(&cudnnBackendGetAttribute) Get;
  decltype(&cudnnBackendFinalize) Finalize;
  decltype(&cudnnBackendExecute) Execute;
  std::string library;
};

absl::StatusOr<Api> Load() {
  void* lib = nullptr;
  std::string errors, name;
  for (const char* n : {"libcudnn.so.9", "libcudnn_graph.so.9", "libcudnn.so"}) {
    if ((lib = dlopen(n, RTLD_NOW | RTLD_LOCAL)) != nullptr) {
      name = n;
      break;
    }
    absl::StrAppend(&errors, errors.empty() ? "" : "; ", dlerror());
  }
  if (lib == nullptr) return absl::UnavailableError(absl::StrCat("cannot load cuDNN: ", errors));
  Api api;
  api.library = name;
  std::string missing;
  auto get = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
    if (fn == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", symbol);
  };
  get(api.GetVersion, "cudnnGetVersion");
  get(api.Create, "cudnnCreate");
  get(api.SetStream, "cudnnSetStream");
  get(api.ErrorString, "cudnnGetErrorString");
  get(api.LastError, "cudnnGetLastErrorString");
  get(api.CreateDesc, "cudnnBackendCreateDescriptor");
  get(api.DestroyDesc, "cudnnBackendDestroyDescriptor");
  get(api.Set, "cudnnBackendSetAttribute");
  get(api.Get, "cudnnBackendGetAttribute");
  get(api.Finalize, "cudnnBackendFinalize");
  get(api.Execute, "cudnnBackendExecute");
  if (!missing.empty()) return absl::UnavailableError(absl::StrCat(name, " lacks ", missing));
  if (api.GetVersion() < 90000)
    return absl::UnavailableError(absl::StrCat(name, " is cuDNN ", api.GetVersion(), "; need 9.0 or newer"));
  return api;
}

absl::StatusOr<const Api*> GetApi() {
  static const absl::StatusOr<Api> loaded = Load();  // thread-safe static init
  if (!loaded.ok()) return loaded.status();
  return &*loaded;
}

std::string Why(const Api& api, cudnnStatus_t st) {
  char detail[512] = {0};
  api.LastError(detail, sizeof detail);
  return absl::StrCat(api.ErrorString(st), detail[0] ? absl::StrCat(" (", detail, ")") : "");
}

using Dims = std::array<int64_t, 4>;
Dims Packed(const Dims& d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

// Owns the descriptors of one graph (and, once built, its plan). Calls after the first
// failure do nothing; status() has the first failure, naming the step.
class Graph {
 public:
  explicit Graph(const Api& api) : api_(api) {}
  ~Graph() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) api_.DestroyDesc(*it);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  const absl::Status& status() const { return status_; }
  cudnnBackendDescriptor_t plan() const { return plan_; }
  int64_t workspace() const { return workspace_; }

  cudnnBackendDescriptor_t New(cudnnBackendDescriptorType_t type, const char* what) {
    cudnnBackendDescriptor_t d = nullptr;
    if (status_.ok()) Check(api_.CreateDesc(type, &d), what);
    if (d != nullptr) owned_.push_back(d);
    return d;
  }
  void Set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, int64_t count,
           const void* v, const char* what) {
    if (status_.ok()) Check(api_.Set(d, n, t, count, v), what);
  }
  void SetDesc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n, cudnnBackendDescriptor_t v, const char* what) {
    Set(d, n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
  }
  void Finalize(cudnnBackendDescriptor_t d, const char* what) {
    if (status_.ok()) Check(api_.Finalize(d), what);
  }

  cudnnBackendDescriptor_t Tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
                                  bool is_virtual = false, bool by_value = false) {
    auto t = New(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    const int64_t align = 16;
    Set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor data type");
    Set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dims");
    Set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides");
    Set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    Set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    Set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual");
    if (by_value) Set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by value");
    Finalize(t, "tensor");
    return t;
  }
  cudnnBackendDescriptor_t Virtual(cudnnDataType_t type, const Dims& dims) {
    return Tensor(next_virtual_++, type, dims, Packed(dims), /*is_virtual=*/true);
  }
  cudnnBackendDescriptor_t Scalar(int64_t uid) { return Tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true); }

  // y = mode(x[, b][, t]) with math in `prec`; axis for GEN_INDEX.
  void Pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, cudnnDataType_t prec = CUDNN_DATA_FLOAT,
                 int64_t axis = -1) {
    auto pw = New(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
    Set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    Set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
    if (axis >= 0) Set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    Finalize(pw, "pointwise");
    auto op = New(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise op");
    SetDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise op descriptor");
    SetDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise op x");
    if (b != nullptr) SetDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise op b");
    if (t != nullptr) SetDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise op t");
    SetDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise op y");
    Finalize(op, "pointwise op");
    ops_.push_back(op);
  }
  void Reduction(cudnnReduceTensorOp_t red, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    auto r = New(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    Set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red, "reduction operator");
    Set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "reduction type");
    Finalize(r, "reduction");
    auto op = New(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction op");
    SetDesc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction op x");
    SetDesc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction op y");
    SetDesc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r, "reduction op descriptor");
    Finalize(op, "reduction op");
    ops_.push_back(op);
  }
  void Matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    auto m = New(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    Set(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul type");
    Finalize(m, "matmul");
    auto op = New(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul op");
    SetDesc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul op a");
    SetDesc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul op b");
    SetDesc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul op c");
    SetDesc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, m, "matmul op descriptor");
    Finalize(op, "matmul op");
    ops_.push_back(op);
  }

  // The operation graph of ops_, then the first engine configuration (in the order cuDNN's
  // heuristics rank them) whose execution plan finalizes.
  void Plan(cudnnHandle_t handle) {
    auto graph = New(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    Set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
    Set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()),
        ops_.data(), "graph ops");
    Finalize(graph, "operation graph");
    auto heur = New(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    SetDesc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph");
    Set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
    Finalize(heur, "heuristics");
    int64_t count = 0;
    if (status_.ok())
      Check(api_.Get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
            "heuristics results");
    if (!status_.ok()) return;
    if (count <= 0) {
      status_ = absl::UnavailableError("cuDNN: no engine for this attention graph");
      return;
    }
    std::vector<cudnnBackendDescriptor_t> configs;
    for (int64_t i = 0; i < count; ++i) configs.push_back(New(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
    if (status_.ok())
      Check(api_.Get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, configs.data()),
            "heuristics results");
    std::string tried;
    for (int64_t i = 0; status_.ok() && i < count; ++i) {
      auto plan = New(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "plan");
      Set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "plan handle");
      SetDesc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[i], "plan engine");
      if (!status_.ok()) return;
      if (cudnnStatus_t st = api_.Finalize(plan); st != CUDNN_STATUS_SUCCESS) {
        absl::StrAppend(&tried, tried.empty() ? "" : "; ", "engine ", i, ": ", Why(api_, st));
        continue;
      }
      int64_t n = 0;
      Check(api_.Get(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &workspace_),
            "plan workspace");
      plan_ = plan;
      return;
    }
    if (status_.ok()) status_ = absl::UnavailableError(absl::StrCat("cuDNN: no engine finalizes: ", tried));
  }

  std::vector<cudnnBackendDescriptor_t> ops_;

 private:
  void Check(cudnnStatus_t st, const char* what) {
    if (st != CUDNN_STATUS_SUCCESS) status_ = absl::UnavailableError(absl::StrCat("cuDNN ", what, ": ", Why(api_, st)));
  }
  const Api& api_;
  absl::Status status_;
  std::vector<cudnnBackendDescriptor_t> owned_;
  int64_t next_virtual_ = 100;
  cudnnBackendDescriptor_t plan_ = nullptr;
  int64_t workspace_ = 0;
};

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kMaskValue };

// The forward graph for d.batch sequences of `seq` tokens over our [tokens, heads, dim]
// memory. `token_major` writes the stats straight into lse [tokens, heads]; else they are
// [batch, heads, seq] and the caller transposes. `p_type` is the probabilities' type.
std::unique_ptr<Graph> Build(const Api& api, cudnnHandle_t handle, const AttentionDims& d, int64_t seq,
                             bool token_major, cudnnDataType_t p_type) {
  auto g = std::make_unique<Graph>(api);
  const int64_t B = d.batch, H = d.q_heads, Hk = d.kv_heads, S = seq, D = d.head_dim;
  auto q = g->Tensor(kQ, CUDNN_DATA_BFLOAT16, {B, H, S, D}, {S * H * D, D, H * D, 1});
  auto kt = g->Tensor(kK, CUDNN_DATA_BFLOAT16, {B, Hk, D, S}, {S * Hk * D, D, 1, Hk * D});
  auto v = g->Tensor(kV, CUDNN_DATA_BFLOAT16, {B, Hk, S, D}, {S * Hk * D, D, Hk * D, 1});
  auto o = g->Tensor(kO, CUDNN_DATA_BFLOAT16, {B, H, S, D}, {S * H * D, D, H * D, 1});
  const Dims row{B, H, S, 1}, full{B, H, S, S};
  auto stats = g->Tensor(kStats, CUDNN_DATA_FLOAT, row, token_major ? Dims{S * H, 1, H, 1} : Packed(row));
  auto scale = g->Scalar(kScale);
  auto s0 = g->Virtual(CUDNN_DATA_FLOAT, full);
  g->Matmul(q, kt, s0);
  auto s = g->Virtual(CUDNN_DATA_FLOAT, full);
  g->Pointwise(CUDNN_POINTWISE_MUL, s0, scale, nullptr, s);
  if (d.causal) {  // keep (row >= col), else the lowest float
    auto r = g->Virtual(CUDNN_DATA_INT32, full), c = g->Virtual(CUDNN_DATA_INT32, full);
    g->Pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, r, CUDNN_DATA_INT32, 2);
    g->Pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, c, CUDNN_DATA_INT32, 3);
    auto keep = g->Virtual(CUDNN_DATA_BOOLEAN, full);
    g->Pointwise(CUDNN_POINTWISE_CMP_GE, r, c, nullptr, keep, CUDNN_DATA_BOOLEAN);
    auto masked = g->Virtual(CUDNN_DATA_FLOAT, full);
    g->Pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, g->Scalar(kMaskValue), keep, masked);
    s = masked;
  }
  auto m = g->Virtual(CUDNN_DATA_FLOAT, row);
  g->Reduction(CUDNN_REDUCE_TENSOR_MAX, s, m);
  auto centered = g->Virtual(CUDNN_DATA_FLOAT, full), e = g->Virtual(CUDNN_DATA_FLOAT, full);
  g->Pointwise(CUDNN_POINTWISE_SUB, s, m, nullptr, centered);
  g->Pointwise(CUDNN_POINTWISE_EXP, centered, nullptr, nullptr, e);
  auto z = g->Virtual(CUDNN_DATA_FLOAT, row), logz = g->Virtual(CUDNN_DATA_FLOAT, row);
  g->Reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  g->Pointwise(CUDNN_POINTWISE_LOG, z, nullptr, nullptr, logz);
  g->Pointwise(CUDNN_POINTWISE_ADD, m, logz, nullptr, stats);
  auto p = g->Virtual(p_type, full);
  g->Pointwise(CUDNN_POINTWISE_DIV, e, z, nullptr, p);
  g->Matmul(p, v, o);
  g->Plan(handle);
  return g;
}

struct Entry {
  std::unique_ptr<Graph> graph;  // null when no variant built (status says why)
  bool token_major = true;
  absl::Status status;
};

// One device's handle and built graphs. Threading: guarded by mu, which a caller holds
// from the lookup until its plan has executed (the handle's stream stays its own).
class DeviceCache {
 public:
  // The built graph for this shape (built on first use) and the handle, its stream set
  // to s. Needs mu() held.
  absl::StatusOr<std::pair<const Entry*, cudnnHandle_t>> Get(const Api& api, const AttentionDims& d, int64_t seq,
                                                             cudaStream_t s, bool build = true, bool bounded = false) {
    const auto key = std::make_tuple(d.batch, seq, d.q_heads, d.kv_heads, d.head_dim, d.causal);
    auto it = entries_.find(key);
    if (it == entries_.end() && !build) return absl::NotFoundError("cuDNN attention: no plan built for this shape");
    if (it == entries_.end() && bounded && static_cast<int64_t>(entries_.size()) >= kCudnnMaxAutoPlans)
      return absl::ResourceExhaustedError(absl::StrCat("cuDNN attention: ", entries_.size(), " shapes hold plans already"));
    if (handle_ == nullptr)
      if (cudnnStatus_t st = api.Create(&handle_); st != CUDNN_STATUS_SUCCESS) {
        handle_ = nullptr;
        return absl::UnavailableError(absl::StrCat("cudnnCreate: ", Why(api, st)));
      }
    if (cudnnStatus_t st = api.SetStream(handle_, s); st != CUDNN_STATUS_SUCCESS)
      return absl::InternalError(absl::StrCat("cudnnSetStream: ", Why(api, st)));
    if (it == entries_.end()) {
      auto e = std::make_unique<Entry>();
      std::string errors;
      // The probabilities in f32 or bf16 and the stats token-major or packed: whichever
      // this cuDNN's engines accept first.
      for (bool token_major : {true, false})
        for (cudnnDataType_t p : {CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT}) {
          if (e->graph != nullptr) break;
          auto g = Build(api, handle_, d, seq, token_major, p);
          if (g->status().ok()) {
            e->graph = std::move(g);
            e->token_major = token_major;
          } else {
            absl::StrAppend(&errors, errors.empty() ? "" : " | ", token_major ? "token-major" : "packed", " stats, P ",
                            p == CUDNN_DATA_FLOAT ? "f32" : "bf16", ": ", g->status().message());
          }
        }
      if (e->graph == nullptr) e->status = absl::UnavailableError(errors);
      it = entries_.emplace(key, std::move(e)).first;
    }
    if (!it->second->status.ok()) return it->second->status;
    return std::make_pair(static_cast<const Entry*>(it->second.get()), handle_);
  }
  std::mutex& mu() { return mu_; }

 private:
  std::mutex mu_;
  cudnnHandle_t handle_ = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool>, std::unique_ptr<Entry>> entries_;
};

// The current device's cache. A lock per device, never one for all: building a plan
// loads kernels, which may wait for this device to drain — and a receive spinning there
// may wait for a rank on another device of this process, which must not then be queued
// behind this build (ranks as threads: trainer_gpu_test's tp2 x pp2 hung so).
absl::StatusOr<DeviceCache*> CacheOfCurrentDevice() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return absl::InternalError("cudaGetDevice failed");
  static std::mutex* mu = new std::mutex();
  static auto* caches = new std::map<int, std::unique_ptr<DeviceCache>>();  // never destroyed (handles)
  std::lock_guard<std::mutex> lock(*mu);
  auto& c = (*caches)[device];
  if (c == nullptr) c = std::make_unique<DeviceCache>();
  return c.get();
}

// What Forward and Prepare share: the dims checked, cuDNN loaded, this device's cache.
struct Target {
  const Api* api;
  DeviceCache* cache;
};
absl::StatusOr<Target> Resolve(const AttentionDims& d, int64_t seq) {
  if (seq <= 0 || d.tokens != d.batch * seq)
    return absl::InvalidArgumentError(absl::StrCat("cuDNN attention: needs sequences of one length; tokens ", d.tokens,
                                                   " != batch ", d.batch, " x seq ", seq));
  auto api = GetApi();
  if (!api.ok()) return api.status();
  TESSERA_ASSIGN_OR_RETURN(DeviceCache * cache, CacheOfCurrentDevice());
  return Target{*api, cache};
}

}  // namespace

absl::Status Forward(const void* q, const void* k, const void* v, void* out, float* lse, const AttentionDims& d,
                     int64_t seq, cudaStream_t s, bool build) {
  TESSERA_ASSIGN_OR_RETURN(const Target target, Resolve(d, seq));
  const Api& a = *target.api;
  std::lock_guard<std::mutex> lock(target.cache->mu());  // the handle's stream stays ours until executed
  auto got = target.cache->Get(a, d, seq, s, build);
  if (!got.ok()) return got.status();
  const Entry& entry = *got->first;
  const Graph& g = *entry.graph;
  float* stats = lse;
  void* scratch = nullptr;
  const int64_t rows = d.tokens * d.q_heads;
  const size_t stats_bytes = entry.token_major ? 0 : rows * sizeof(float);
  const size_t bytes = stats_bytes + static_cast<size_t>(g.workspace()) + 256;
  if (cudaMallocAsync(&scratch, bytes, s) != cudaSuccess) return absl::ResourceExhaustedError("cuDNN attention: workspace");
  if (!entry.token_major) stats = static_cast<float*>(scratch);
  void* workspace = static_cast<char*>(scratch) + ((stats_bytes + 255) / 256) * 256;
  float scale = d.scale, mask_value = -3.4028234663852886e38f;  // lowest float, as cudnn_frontend
  int64_t uids[] = {kQ, kK, kV, kO, kStats, kScale, kMaskValue};
  void* ptrs[] = {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), out, stats, &scale, &mask_value};
  const int64_t n = d.causal ? 7 : 6;
  absl::Status st;
  cudnnBackendDescriptor_t pack = nullptr;
  cudnnStatus_t r = a.CreateDesc(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (r == CUDNN_STATUS_SUCCESS) r = a.Set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
  if (r == CUDNN_STATUS_SUCCESS) r = a.Set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
  if (r == CUDNN_STATUS_SUCCESS) r = a.Set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  if (r == CUDNN_STATUS_SUCCESS) r = a.Finalize(pack);
  if (r == CUDNN_STATUS_SUCCESS) r = a.Execute(got->second, g.plan(), pack);
  if (r != CUDNN_STATUS_SUCCESS) st = absl::InternalError(absl::StrCat("cuDNN attention forward: ", Why(a, r)));
  if (pack != nullptr) a.DestroyDesc(pack);
  if (st.ok() && !entry.token_major) {
    st = StatsToTokenMajor(stats, lse, d.q_heads, seq, d.tokens, s);
  }
  cudaFreeAsync(scratch, s);
  return st;
}

absl::Status Prepare(const AttentionDims& d, int64_t seq, cudaStream_t s, bool bounded) {
  TESSERA_ASSIGN_OR_RETURN(const Target target, Resolve(d, seq));
  std::lock_guard<std::mutex> lock(target.cache->mu());
  return target.cache->Get(*target.api, d, seq, s, /*build=*/true, bounded).status();
}

std::string Describe() {
  auto api = GetApi();
  if (!api.ok()) return std::string(api.status().message());
  const size_t v = (*api)->GetVersion();
  return absl::StrCat("cuDNN ", v / 10000, ".", (v % 10000) / 100, ".", v % 100, " (", (*api)->library, ")");
}

}  // namespace tessera::kernels::cudnn_attention
