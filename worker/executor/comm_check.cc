#include "worker/executor/comm_check.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera::executor {
namespace {


class HostSpace final : public BufferSpace {
 public:
  absl::StatusOr<void*> Alloc(size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    return p;
  }
  void Free(void* p) override { std::free(p); }
  absl::Status Upload(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); return absl::OkStatus(); }
  absl::Status Download(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); return absl::OkStatus(); }
  absl::Status Fill(void* d, uint8_t b, size_t n) override { std::memset(d, b, n); return absl::OkStatus(); }
  absl::StatusOr<double> Time(const std::function<absl::Status()>& fn, comm::Communicator& c) override {
    auto t0 = std::chrono::steady_clock::now();
    TESSERA_RETURN_IF_ERROR(fn());
    TESSERA_RETURN_IF_ERROR(c.Synchronize());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

// Value of element i on rank r: a small integer, so sums over up to 64 ranks are
// exact in f32, bf16 and i32.
int Val(int r, size_t i) { return static_cast<int>((static_cast<size_t>(r) * 7 + i) % 5); }

void Encode(DType t, const std::vector<float>& v, std::vector<char>& out) {
  size_t es = tessera::DTypeSize(t);
  out.resize(v.size() * es);
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kF32) std::memcpy(&out[i * 4], &v[i], 4);
    else if (t == DType::kI32) { int32_t x = static_cast<int32_t>(v[i]); std::memcpy(&out[i * 4], &x, 4); }
    else {  // bf16: the top half of the f32 (exact for small integers)
      uint32_t u;
      std::memcpy(&u, &v[i], 4);
      uint16_t h = static_cast<uint16_t>(u >> 16);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
}

float Decode(DType t, const char* p) {
  if (t == DType::kF32) { float f; std::memcpy(&f, p, 4); return f; }
  if (t == DType::kI32) { int32_t x; std::memcpy(&x, p, 4); return static_cast<float>(x); }
  uint16_t h;
  std::memcpy(&h, p, 2);
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

double BusFactor(const std::string& coll, int n) {
  if (coll == "all_reduce") return 2.0 * (n - 1) / n;
  if (coll == "all_gather" || coll == "reduce_scatter") return static_cast<double>(n - 1) / n;
  return 1.0;
}

struct Bufs {
  BufferSpace& s;
  void* in = nullptr;
  void* out = nullptr;
  ~Bufs() { if (in) s.Free(in); if (out) s.Free(out); }
};

}  // namespace

std::unique_ptr<BufferSpace> MakeHostBufferSpace() { return std::make_unique<HostSpace>(); }

absl::Status RunCommCheck(comm::Communicator& c, BufferSpace& space, const CommCheckArgs& a, int group_index,
                          v1::CommCheckResponse* out) {
  const int n = c.size(), r = c.rank();
  const size_t es = tessera::DTypeSize(a.dtype);
  for (const auto& coll : a.collectives) {
    for (int64_t size : a.sizes) {
      if (coll == "send_recv" && n < 2) continue;
      // nccl-tests convention: `size` is the full buffer (gathered, or before scatter).
      size_t count = static_cast<size_t>(size) / es;
      if (coll == "all_gather" || coll == "reduce_scatter") count = count / n * n;
      if (count == 0) continue;
      size_t chunk = count / n;  // per-rank share for gather/scatter
      size_t in_count = coll == "all_gather" ? chunk : count;
      size_t out_count = coll == "reduce_scatter" ? chunk : count;
      Bufs b{space};
      TESSERA_ASSIGN_OR_RETURN(b.in, space.Alloc(in_count * es));
      TESSERA_ASSIGN_OR_RETURN(b.out, space.Alloc(out_count * es));
      std::vector<float> host_in(in_count);
      for (size_t i = 0; i < in_count; ++i) host_in[i] = static_cast<float>(Val(r, i));
      std::vector<char> enc;
      Encode(a.dtype, host_in, enc);
      int next = (r + 1) % n, prev = (r + n - 1) % n;
      auto op = [&]() -> absl::Status {
        if (coll == "all_reduce") return c.AllReduce(b.in, b.out, count, a.dtype, comm::ReduceOp::kSum);
        if (coll == "all_gather") return c.AllGather(b.in, b.out, chunk, a.dtype);
        if (coll == "reduce_scatter") return c.ReduceScatter(b.in, b.out, chunk, a.dtype, comm::ReduceOp::kSum);
        if (coll == "broadcast") return c.Broadcast(b.out, count, a.dtype, 0);
        // send_recv: a ring shift, every rank sends to the next and receives from the previous.
        c.GroupStart();
        auto s1 = c.Send(b.in, count, a.dtype, next);
        auto s2 = c.Recv(b.out, count, a.dtype, prev);
        auto s3 = c.GroupEnd();
        return !s1.ok() ? s1 : !s2.ok() ? s2 : s3;
      };
      auto prepare = [&]() -> absl::Status {
        TESSERA_RETURN_IF_ERROR(space.Upload(b.in, enc.data(), enc.size()));
        TESSERA_RETURN_IF_ERROR(space.Fill(b.out, 0xff, out_count * es));  // poison: NaN / -1
        if (coll == "broadcast" && r == 0) TESSERA_RETURN_IF_ERROR(space.Upload(b.out, enc.data(), enc.size()));
        return absl::OkStatus();
      };
      // Check: one run on fresh inputs and a poisoned output, every element compared.
      TESSERA_RETURN_IF_ERROR(prepare());
      TESSERA_RETURN_IF_ERROR(op());
      TESSERA_RETURN_IF_ERROR(c.Synchronize());
      std::vector<char> got(out_count * es);
      TESSERA_RETURN_IF_ERROR(space.Download(got.data(), b.out, got.size()));
      int64_t errors = 0;
      std::string first;
      for (size_t i = 0; i < out_count; ++i) {
        float want = 0;
        if (coll == "all_reduce") for (int q = 0; q < n; ++q) want += Val(q, i);
        else if (coll == "all_gather") want = Val(static_cast<int>(i / chunk), i % chunk);
        else if (coll == "reduce_scatter") for (int q = 0; q < n; ++q) want += Val(q, r * chunk + i);
        else if (coll == "broadcast") want = Val(0, i);
        else want = Val(prev, i);
        float g = Decode(a.dtype, &got[i * es]);
        if (g != want) {
          if (errors++ == 0) first = absl::StrCat("element ", i, " is ", g, ", expected ", want);
        }
      }
      // Time: warmup, then `iters` back-to-back runs (inputs need no refresh: all
      // operations are out of place, except broadcast, whose content is irrelevant here).
      for (int w = 0; w < a.warmup; ++w) TESSERA_RETURN_IF_ERROR(op());
      TESSERA_RETURN_IF_ERROR(c.Synchronize());
      TESSERA_RETURN_IF_ERROR(c.Barrier());
      TESSERA_ASSIGN_OR_RETURN(double secs, space.Time([&]() -> absl::Status {
        for (int it = 0; it < a.iters; ++it) TESSERA_RETURN_IF_ERROR(op());
        return absl::OkStatus();
      }, c));
      double t = secs / a.iters;
      double bytes = static_cast<double>(count * es);
      double algbw = bytes / t / 1e9;
      v1::CommCheckResult* row = out->add_results();
      row->set_collective(coll), row->set_size_bytes(static_cast<int64_t>(count * es));
      row->set_group_index(group_index), row->set_group_size(n);
      row->set_time_us(t * 1e6), row->set_algbw_gbps(algbw), row->set_busbw_gbps(algbw * BusFactor(coll, n));
      row->set_errors(errors), row->set_first_error(first);
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::executor
