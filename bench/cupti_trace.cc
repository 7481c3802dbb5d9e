// CUPTI activity trace (see cupti_trace.h).
#include "bench/cupti_trace.h"

#include <cupti.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera::bench {
namespace {

struct Api {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks;
  decltype(&cuptiActivityEnable) enable;
  decltype(&cuptiActivityDisable) disable;
  decltype(&cuptiActivityFlushAll) flush_all;
  decltype(&cuptiActivityGetNextRecord) next_record;
  decltype(&cuptiGetTimestamp) timestamp;
  decltype(&cuptiGetResultString) result_string;
};

struct Record {
  const char* kind;
  uint64_t start, end;
  uint32_t device, stream;
  std::string name;
};

// The process's one trace: CUPTI's buffer callbacks are plain functions.
struct State {
  std::mutex mu;
  Api api{};
  bool running = false;
  std::vector<Record> records;  // guarded by mu
  uint64_t malformed = 0;       // guarded by mu: records whose buffer CUPTI could not walk
};
State& state() {
  static auto* s = new State();  // never destroyed: CUPTI may call back at exit
  return *s;
}

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

const char* CopyKind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "other";
  }
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  State& s = state();
  std::vector<Record> got;
  CUpti_Activity* r = nullptr;
  bool malformed = false;
  while (true) {
    const CUptiResult st = s.api.next_record(buffer, valid, &r);
    if (st == CUPTI_ERROR_MAX_LIMIT_REACHED) break;
    if (st != CUPTI_SUCCESS) {
      malformed = true;
      break;
    }
    switch (r->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
        got.push_back({"kernel", k->start, k->end, k->deviceId, k->streamId, k->name != nullptr ? k->name : "?"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
        got.push_back({"memcpy", m->start, m->end, m->deviceId, m->streamId,
                       absl::StrCat("memcpy ", CopyKind(m->copyKind), " ", m->bytes, " B")});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
        got.push_back({"memset", m->start, m->end, m->deviceId, m->streamId, absl::StrCat("memset ", m->bytes, " B")});
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(s.mu);
  s.malformed += malformed;
  for (Record& x : got) s.records.push_back(std::move(x));
}

std::string Why(const Api& api, CUptiResult r) {
  const char* text = nullptr;
  if (api.result_string != nullptr && api.result_string(r, &text) == CUPTI_SUCCESS && text != nullptr) return text;
  return absl::StrCat("CUPTI error ", static_cast<int>(r));
}

absl::StatusOr<Api> Load() {
  void* lib = nullptr;
  std::string tried;
  for (const char* name : {"libcupti.so.13", "libcupti.so", "/usr/local/cuda/lib64/libcupti.so.13",
                           "/usr/local/cuda/lib/libcupti.so.13", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13"}) {
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    absl::StrAppend(&tried, tried.empty() ? "" : ", ", name);
  }
  if (lib == nullptr)
    return absl::UnavailableError(absl::StrCat("cupti trace: cannot load libcupti (tried ", tried,
                                               "; put its folder on LD_LIBRARY_PATH)"));
  Api a{};
  auto sym = [&](const char* n, auto& f) {
    f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, n));
    return f != nullptr;
  };
  if (!sym("cuptiActivityRegisterCallbacks", a.register_callbacks) || !sym("cuptiActivityEnable", a.enable) ||
      !sym("cuptiActivityDisable", a.disable) || !sym("cuptiActivityFlushAll", a.flush_all) ||
      !sym("cuptiActivityGetNextRecord", a.next_record) || !sym("cuptiGetTimestamp", a.timestamp) ||
      !sym("cuptiGetResultString", a.result_string))
    return absl::UnavailableError("cupti trace: libcupti lacks the activity API");
  return a;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CuptiTrace>> CuptiTrace::Start() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.running) return absl::FailedPreconditionError("cupti trace: one already runs in this process");
  auto api = Load();
  if (!api.ok()) return api.status();
  s.api = *api;
  if (CUptiResult r = s.api.register_callbacks(BufferRequested, BufferCompleted); r != CUPTI_SUCCESS)
    return absl::UnavailableError(absl::StrCat("cupti trace: cuptiActivityRegisterCallbacks: ", Why(s.api, r)));
  for (CUpti_ActivityKind k : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET})
    if (CUptiResult r = s.api.enable(k); r != CUPTI_SUCCESS)
      return absl::UnavailableError(absl::StrCat("cupti trace: cuptiActivityEnable(", static_cast<int>(k), "): ", Why(s.api, r)));
  s.running = true;
  return std::unique_ptr<CuptiTrace>(new CuptiTrace());
}

CuptiTrace::~CuptiTrace() {
  State& s = state();
  for (CUpti_ActivityKind k : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET})
    s.api.disable(k);
  s.api.flush_all(1);
  std::lock_guard<std::mutex> lock(s.mu);
  s.records.clear();
  s.running = false;
}

uint64_t CuptiTrace::Now() const {
  uint64_t t = 0;
  state().api.timestamp(&t);
  return t;
}

void CuptiTrace::Range(const std::string& name, uint64_t start_ns, uint64_t end_ns) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.records.push_back({"range", start_ns, end_ns, 0, 0, name});
}

absl::Status CuptiTrace::Write(const std::string& path, std::string* summary) {
  State& s = state();
  if (CUptiResult r = s.api.flush_all(1); r != CUPTI_SUCCESS)  // forced: records of unfinished buffers too
    return absl::UnavailableError(absl::StrCat("cupti trace: cuptiActivityFlushAll: ", Why(s.api, r)));
  std::lock_guard<std::mutex> lock(s.mu);
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return absl::UnavailableError(absl::StrCat("cupti trace: cannot write ", tmp));
  std::fprintf(f, "kind,start_ns,end_ns,device,stream,name\n");
  size_t kernels = 0, copies = 0, ranges = 0;
  for (const Record& r : s.records) {
    std::string name = r.name;  // CSV: quoted, inner quotes doubled (C++ names hold commas)
    for (size_t at = name.find('"'); at != std::string::npos; at = name.find('"', at + 2)) name.insert(at, 1, '"');
    std::fprintf(f, "%s,%llu,%llu,%u,%u,\"%s\"\n", r.kind, static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.device, r.stream, name.c_str());
    kernels += r.kind[0] == 'k', copies += r.kind[0] == 'm', ranges += r.kind[0] == 'r';
  }
  const bool ok = std::fflush(f) == 0 && std::ferror(f) == 0;
  std::fclose(f);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cupti trace: writing ", path, " failed"));
  }
  if (summary != nullptr)
    *summary = absl::StrCat(kernels, " kernels, ", copies, " copies and memsets, ", ranges, " ranges",
                            s.malformed ? absl::StrCat(", ", s.malformed, " buffers cut short") : "");
  return absl::OkStatus();
}

}  // namespace tessera::bench
