#include "worker/comm/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera::comm {
namespace {


template <typename T, ReduceOp op>
void Reduce(void* c, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (op == ReduceOp::kSum) o[i] = x[i] + y[i];
    else if constexpr (op == ReduceOp::kMax) o[i] = x[i] > y[i] ? x[i] : y[i];
    else o[i] = x[i] < y[i] ? x[i] : y[i];
  }
}

template <ReduceOp op>
void ReduceBf16(void* c, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(c);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    float fx = Bf16ToFloat(x[i]), fy = Bf16ToFloat(y[i]);
    float r = op == ReduceOp::kSum ? fx + fy : op == ReduceOp::kMax ? std::max(fx, fy) : std::min(fx, fy);
    o[i] = FloatToBf16(r);
  }
}

template <typename T>
gloo::AllreduceOptions::Func PickTyped(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return &Reduce<T, ReduceOp::kSum>;
    case ReduceOp::kMax: return &Reduce<T, ReduceOp::kMax>;
    case ReduceOp::kMin: return &Reduce<T, ReduceOp::kMin>;
  }
  return nullptr;
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::string name, int rank, int size, std::shared_ptr<gloo::Context> ctx, int64_t timeout_ms)
      : Communicator(std::move(name), rank, size), ctx_(std::move(ctx)), timeout_(timeout_ms) {}
  const char* backend() const override { return "gloo"; }
  absl::Status Synchronize() override { return absl::OkStatus(); }  // every call is blocking
  void Abort() override {
    // Gloo has no abort; pending waits end at their timeout.
  }

 protected:
  template <typename F>
  absl::Status Guard(F&& f) {
    try {
      f();
      return absl::OkStatus();
    } catch (const std::exception& e) {
      std::string m = e.what();
      bool timeout = m.find("imeout") != std::string::npos || m.find("imed out") != std::string::npos;
      return timeout ? absl::DeadlineExceededError(absl::StrCat("timed out after ", timeout_.count(), " ms: ", m))
                     : absl::UnavailableError(m);
    }
  }

  absl::Status DoAllReduce(const void* in, void* out, size_t count, DType t, ReduceOp op) override {
    return Guard([&] {
      gloo::AllreduceOptions o(ctx_);
      o.setTimeout(timeout_);
      o.setTag(NextTag());
      switch (t) {
        case DType::kF32: SetIO<float>(o, in, out, count); o.setReduceFunction(PickTyped<float>(op)); break;
        case DType::kI32: SetIO<int32_t>(o, in, out, count); o.setReduceFunction(PickTyped<int32_t>(op)); break;
        case DType::kI64: SetIO<int64_t>(o, in, out, count); o.setReduceFunction(PickTyped<int64_t>(op)); break;
        case DType::kU8: SetIO<uint8_t>(o, in, out, count); o.setReduceFunction(PickTyped<uint8_t>(op)); break;
        case DType::kBF16:
          SetIO<uint16_t>(o, in, out, count);
          o.setReduceFunction(op == ReduceOp::kSum ? &ReduceBf16<ReduceOp::kSum>
                              : op == ReduceOp::kMax ? &ReduceBf16<ReduceOp::kMax> : &ReduceBf16<ReduceOp::kMin>);
          break;
        case DType::kF16: throw std::runtime_error("f16 reductions are not supported by the Gloo backend");
      }
      gloo::allreduce(o);
    });
  }

  // Gloo has no reduce-scatter in its options API: all-reduce a copy, keep this rank's
  // chunk. Correct, at 2x the traffic of a ring reduce-scatter (CPU backend only).
  absl::Status DoReduceScatter(const void* in, void* out, size_t recv_count, DType t, ReduceOp op) override {
    size_t es = DTypeSize(t);
    std::vector<char> tmp(recv_count * size() * es);
    auto st = DoAllReduce(in, tmp.data(), recv_count * size(), t, op);
    if (!st.ok()) return st;
    std::memcpy(out, tmp.data() + rank() * recv_count * es, recv_count * es);
    return absl::OkStatus();
  }

  absl::Status DoAllGather(const void* in, void* out, size_t send_count, DType t) override {
    return Guard([&] {
      size_t bytes = send_count * DTypeSize(t);
      // In place (`in` is this rank's part of `out`): Gloo copies the input into the output
      // with memcpy, which must not see the same bytes on both sides.
      std::vector<uint8_t> own;
      if (in == static_cast<const uint8_t*>(out) + rank() * bytes) {
        own.assign(static_cast<const uint8_t*>(in), static_cast<const uint8_t*>(in) + bytes);
        in = own.data();
      }
      gloo::AllgatherOptions o(ctx_);
      o.setTimeout(timeout_);
      o.setTag(NextTag());
      o.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), bytes);
      o.setOutput(static_cast<uint8_t*>(out), bytes * size());
      gloo::allgather(o);
    });
  }

  absl::Status DoBroadcast(void* buf, size_t count, DType t, int root) override {
    return Guard([&] {
      gloo::BroadcastOptions o(ctx_);
      o.setTimeout(timeout_);
      o.setTag(NextTag());
      o.setRoot(root);
      o.setOutput(static_cast<uint8_t*>(buf), count * DTypeSize(t));
      gloo::broadcast(o);
    });
  }

  absl::Status DoSend(const void* buf, size_t count, DType t, int peer) override {
    auto st = Guard([&] {
      auto ub = ctx_->createUnboundBuffer(const_cast<void*>(buf), count * DTypeSize(t));
      ub->send(peer, SlotFor(rank(), peer));
      if (grouped_) pending_sends_.push_back(std::move(ub));
      else if (!ub->waitSend(timeout_)) throw std::runtime_error("send timed out");
    });
    return st;
  }

  absl::Status DoRecv(void* buf, size_t count, DType t, int peer) override {
    return Guard([&] {
      auto ub = ctx_->createUnboundBuffer(buf, count * DTypeSize(t));
      ub->recv(peer, SlotFor(peer, rank()));
      if (grouped_) pending_recvs_.push_back(std::move(ub));
      else if (!ub->waitRecv(timeout_)) throw std::runtime_error("recv timed out");
    });
  }

  absl::Status DoIsend(const void* buf, size_t count, DType t, int peer, int tag) override {
    return Guard([&] {
      auto ub = ctx_->createUnboundBuffer(const_cast<void*>(buf), count * DTypeSize(t));
      ub->send(peer, SlotFor(rank(), peer, tag));
      async_sends_.push_back(std::move(ub));
    });
  }
  absl::Status DoRecvTagged(void* buf, size_t count, DType t, int peer, int tag) override {
    return Guard([&] {
      auto ub = ctx_->createUnboundBuffer(buf, count * DTypeSize(t));
      ub->recv(peer, SlotFor(peer, rank(), tag));
      if (!ub->waitRecv(timeout_)) throw std::runtime_error("recv timed out");
    });
  }
  absl::Status DoWaitSends() override {
    auto st = Guard([&] {
      for (auto& s : async_sends_)
        if (!s->waitSend(timeout_)) throw std::runtime_error("send timed out");
    });
    async_sends_.clear();
    return st;
  }

  absl::Status DoBarrier() override {
    return Guard([&] {
      gloo::BarrierOptions o(ctx_);
      o.setTimeout(timeout_);
      o.setTag(NextTag());
      gloo::barrier(o);
    });
  }

  void DoGroupStart() override { grouped_ = true; }
  absl::Status DoGroupEnd() override {
    grouped_ = false;
    auto st = Guard([&] {
      for (auto& r : pending_recvs_) if (!r->waitRecv(timeout_)) throw std::runtime_error("recv timed out");
      for (auto& s : pending_sends_) if (!s->waitSend(timeout_)) throw std::runtime_error("send timed out");
    });
    pending_recvs_.clear();
    pending_sends_.clear();
    return st;
  }

 private:
  template <typename T>
  void SetIO(gloo::AllreduceOptions& o, const void* in, void* out, size_t count) {
    o.setInput(const_cast<T*>(static_cast<const T*>(in)), count);
    o.setOutput(static_cast<T*>(out), count);
  }
  uint32_t NextTag() { return static_cast<uint32_t>(++tag_); }
  // Point-to-point slots: distinct per (src, dst) pair and per message.
  // Tags 1-3 get their own sequence (and slot bits); tag 0 is what Send/Recv use.
  uint64_t SlotFor(int src, int dst, int tag = 0) {
    return (1ULL << 40) | static_cast<uint64_t>(tag) << 41 | (static_cast<uint64_t>(src) << 20 | dst) << 8 |
           (p2p_seq_[(src * 4096 + dst) * 4 + tag]++ & 0xff);
  }

  std::shared_ptr<gloo::Context> ctx_;
  std::chrono::milliseconds timeout_;
  uint64_t tag_ = 0;
  bool grouped_ = false;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> pending_sends_, pending_recvs_, async_sends_;
  std::map<int, uint64_t> p2p_seq_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicator(const std::string& name, const std::string& key,
                                                                   int rank, int size, KvStore* rdv,
                                                                   const GlooOptions& opts) {
  if (size == 1) return MakeSelfCommunicator(name);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = opts.listen_host;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(std::chrono::milliseconds(opts.timeout_ms));
    GlooStore store(rdv, "gloo/" + key, opts.timeout_ms);
    ctx->connectFullMesh(store, dev);
    return std::unique_ptr<Communicator>(
        std::make_unique<GlooCommunicator>(name, rank, size, std::move(ctx), opts.timeout_ms));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("communicator '", name, "' (gloo, rank ", rank, " of ", size,
                                               "): bootstrap failed: ", e.what()));
  }
}

}  // namespace tessera::comm
