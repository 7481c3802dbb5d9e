#include "worker/comm/communicator.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tessera::comm {

absl::Status Communicator::Describe(const absl::Status& s, const char* op) const {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("communicator '", name_, "' (", backend(), ", rank ", rank_, " of ",
                                             size_, "): ", op, " #", seq_, ": ", s.message()));
}

template <typename F>
absl::Status Communicator::Run(const char* op, size_t bytes, F&& f, bool host_op) {
  ++seq_;
  last_op_ = op;
  auto t0 = std::chrono::steady_clock::now();
  absl::Status s = f();
  stats_.calls++;
  stats_.bytes += bytes;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats_.seconds += dt;
  if (host_op) stats_.host_op_seconds += dt;
  return Describe(s, op);
}

namespace {
absl::Status Bad(const std::string& m) { return absl::InvalidArgumentError(m); }
}  // namespace

absl::Status Communicator::AllReduce(const void* in, void* out, size_t count, DType t, ReduceOp op) {
  if (!in || !out) return Describe(Bad("null buffer"), "all_reduce");
  return Run("all_reduce", count * DTypeSize(t), [&] { return DoAllReduce(in, out, count, t, op); });
}

absl::Status Communicator::ReduceScatter(const void* in, void* out, size_t recv_count, DType t, ReduceOp op) {
  if (!in || !out) return Describe(Bad("null buffer"), "reduce_scatter");
  return Run("reduce_scatter", recv_count * size_ * DTypeSize(t), [&] { return DoReduceScatter(in, out, recv_count, t, op); });
}

absl::Status Communicator::AllGather(const void* in, void* out, size_t send_count, DType t) {
  if (!in || !out) return Describe(Bad("null buffer"), "all_gather");
  return Run("all_gather", send_count * size_ * DTypeSize(t), [&] { return DoAllGather(in, out, send_count, t); });
}

absl::Status Communicator::AllReduceHost(const void* in, void* out, size_t count, DType t, ReduceOp op) {
  if (!in || !out) return Describe(Bad("null buffer"), "all_reduce_host");
  return Run("all_reduce_host", count * DTypeSize(t), [&] { return DoAllReduceHost(in, out, count, t, op); },
             /*host_op=*/true);
}

absl::Status Communicator::AllGatherHost(const void* in, void* out, size_t send_count, DType t) {
  if (!in || !out) return Describe(Bad("null buffer"), "all_gather_host");
  return Run("all_gather_host", send_count * size_ * DTypeSize(t), [&] { return DoAllGatherHost(in, out, send_count, t); },
             /*host_op=*/true);
}

absl::Status Communicator::Broadcast(void* buf, size_t count, DType t, int root) {
  if (root < 0 || root >= size_) return Describe(Bad(absl::StrCat("root ", root, " is not a rank of ", size_)), "broadcast");
  return Run("broadcast", count * DTypeSize(t), [&] { return DoBroadcast(buf, count, t, root); });
}

absl::Status Communicator::Send(const void* buf, size_t count, DType t, int peer) {
  if (peer < 0 || peer >= size_ || peer == rank_)
    return Describe(Bad(absl::StrCat("peer ", peer, " is not another rank of ", size_)), "send");
  return Run("send", count * DTypeSize(t), [&] { return DoSend(buf, count, t, peer); });
}

absl::Status Communicator::Recv(void* buf, size_t count, DType t, int peer) {
  if (peer < 0 || peer >= size_ || peer == rank_)
    return Describe(Bad(absl::StrCat("peer ", peer, " is not another rank of ", size_)), "recv");
  return Run("recv", count * DTypeSize(t), [&] { return DoRecv(buf, count, t, peer); });
}

absl::Status Communicator::Isend(const void* buf, size_t count, DType t, int peer, int tag) {
  if (peer < 0 || peer >= size_ || peer == rank_ || tag < 0 || tag > 3)
    return Describe(Bad(absl::StrCat("peer ", peer, " (of ", size_, ") or tag ", tag, " is invalid")), "isend");
  return Run("isend", count * DTypeSize(t), [&] { return DoIsend(buf, count, t, peer, tag); });
}

absl::Status Communicator::RecvTagged(void* buf, size_t count, DType t, int peer, int tag) {
  if (peer < 0 || peer >= size_ || peer == rank_ || tag < 0 || tag > 3)
    return Describe(Bad(absl::StrCat("peer ", peer, " (of ", size_, ") or tag ", tag, " is invalid")), "recv");
  return Run("recv", count * DTypeSize(t), [&] { return DoRecvTagged(buf, count, t, peer, tag); });
}

absl::Status Communicator::WaitSends() {
  return Run("wait_sends", 0, [&] { return DoWaitSends(); });
}

absl::Status Communicator::Barrier() {
  return Run("barrier", 0, [&] { return DoBarrier(); });
}

void Communicator::GroupStart() {
  if (group_depth_++ == 0) DoGroupStart();
}

absl::Status Communicator::GroupEnd() {
  if (group_depth_ == 0) return Describe(absl::FailedPreconditionError("GroupEnd without GroupStart"), "group_end");
  if (--group_depth_ > 0) return absl::OkStatus();
  return Describe(DoGroupEnd(), "group_end");
}

namespace {
class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string name) : Communicator(std::move(name), 0, 1) {}
  const char* backend() const override { return "self"; }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  void Abort() override {}

 protected:
  absl::Status DoAllReduce(const void* in, void* out, size_t n, DType t, ReduceOp) override {
    if (in != out) std::memmove(out, in, n * DTypeSize(t));
    return absl::OkStatus();
  }
  absl::Status DoReduceScatter(const void* in, void* out, size_t n, DType t, ReduceOp) override {
    if (in != out) std::memmove(out, in, n * DTypeSize(t));
    return absl::OkStatus();
  }
  absl::Status DoAllGather(const void* in, void* out, size_t n, DType t) override {
    if (in != out) std::memmove(out, in, n * DTypeSize(t));
    return absl::OkStatus();
  }
  absl::Status DoBroadcast(void*, size_t, DType, int) override { return absl::OkStatus(); }
  absl::Status DoSend(const void*, size_t, DType, int) override { return absl::InternalError("no peer"); }
  absl::Status DoRecv(void*, size_t, DType, int) override { return absl::InternalError("no peer"); }
  absl::Status DoBarrier() override { return absl::OkStatus(); }
};
}  // namespace

std::unique_ptr<Communicator> MakeSelfCommunicator(std::string name) {
  return std::make_unique<SelfCommunicator>(std::move(name));
}

}  // namespace tessera::comm
