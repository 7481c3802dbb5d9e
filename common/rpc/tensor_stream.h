// TensorBatch on a gRPC stream: a batch goes as a sequence of TensorChunk messages
// (proto/tessera/v1/common.proto), none larger than a few MiB, so that no message nears
// the transport's size limit whatever the batch's size. F32Tensor makes one of the f32
// tensors the RL steps exchange (rewards, scores, per-token values).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tessera/v1/common.pb.h"

namespace tessera {

// Bytes per element of a tensor dtype (0 for DTYPE_UNSPECIFIED and unknown values).
int TensorDTypeBytes(v1::DType t);

// An f32 tensor `name` of `shape` holding `values` (as many as the shape has).
v1::NamedTensor F32Tensor(const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& values);

inline constexpr size_t kTensorChunkBytes = size_t{4} << 20;

// Calls `emit` with the chunks of `batch`, in order, each with at most `chunk_bytes` of
// data (a tensor with no data is one chunk). Stops at the first false `emit` returns and
// then returns false (a stream that broke).
bool ForEachChunk(const v1::TensorBatch& batch, const std::function<bool(const v1::TensorChunk&)>& emit,
                  size_t chunk_bytes = kTensorChunkBytes);

// A streamed call's messages M carry a first part (a header, or statistics) and then a
// batch in M's `chunk` part: writes `first`, then the batch's chunks (ForEachChunk's
// size) on `stream` (any gRPC writer of M). False once a write fails (the peer ended
// the call; its Finish says why).
template <class Stream, class M>
bool WriteWithChunks(Stream& stream, M first, const v1::TensorBatch& batch) {
  if (!stream.Write(first)) return false;
  return ForEachChunk(batch, [&](const v1::TensorChunk& c) {
    *first.mutable_chunk() = c;
    return stream.Write(first);
  });
}

// Rebuilds a batch from its chunks, in the order they came. Add refuses (INVALID_ARGUMENT,
// naming the tensor) a first chunk without a name, a repeated name, and more data than
// the tensor's shape holds; Finish refuses a tensor with less data than its shape holds.
class BatchAssembler {
 public:
  absl::Status Add(v1::TensorChunk&& chunk);
  absl::StatusOr<v1::TensorBatch> Finish() &&;

 private:
  absl::Status CheckLast(bool complete) const;
  v1::TensorBatch batch_;
  int64_t expect_ = 0;  // bytes the last tensor's shape holds
};

}  // namespace tessera
