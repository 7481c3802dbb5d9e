// Context parallelism (docs/design.md §6): the load-balanced causal split and ring attention.
//
// Every sequence of a packed batch is cut into 2·cp equal chunks; CP rank r keeps
// chunks r and 2·cp−1−r of every sequence, so that each rank gets the same share of
// the causal attention work. A rank's local batch holds all its first chunks, then all
// its second chunks (two halves with the same chunk lengths): cu_seqlens lists the 2B
// chunk boundaries, positions stay global (for RoPE) and targets are the global next
// tokens. Sequences are padded with loss-free tokens to a multiple of 2·cp·multiple
// first (padding at a sequence's end changes nothing before it under a causal mask).
//
// Ring attention: the K/V of the local chunks travel round the CP ring (cp − 1 hops);
// each step attends the local query chunks to the visiting key chunks that precede them
// — a chunk pair (a, b) is full attention for a > b, causal for a = b, nothing for
// a < b — and merges the partial results with their log-sum-exp. The backward walks
// the same ring with the final output and log-sum-exp (which make each block's
// gradient exact) and carries the visiting chunks' dK/dV with them, one more hop
// bringing them home.
#pragma once

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/model/llama.h"
#include "worker/runtime/backend.h"

namespace tessera::model {

// This CP rank's part of a packed global batch (see above). INVALID_ARGUMENT naming the
// field when the batch is malformed.
absl::StatusOr<TokenBatch> SplitForContextParallel(const TokenBatch& global, int cp, int rank, int multiple = 1);

// A local batch's chunk boundaries within one half ([B + 1], host), after checking that
// cu_seqlens has 2B + 1 entries and the two halves the same chunk lengths.
absl::StatusOr<std::vector<int32_t>> ContextParallelHalf(const TokenBatch& local);

// q [T, Hq, D], k/v [T, Hkv, D] of this rank's two halves; cu_half [B + 1] (host) the
// chunk boundaries within a half; out [T, Hq, D], lse [T, Hq].
absl::Status RingAttentionForward(runtime::Backend& b, comm::Communicator& cp, const runtime::Tensor& q,
                                  const runtime::Tensor& k, const runtime::Tensor& v, const runtime::Tensor& cu_half,
                                  runtime::Tensor& out, runtime::Tensor& lse);
// dq, dk, dv are written (not accumulated).
absl::Status RingAttentionBackward(runtime::Backend& b, comm::Communicator& cp, const runtime::Tensor& q,
                                   const runtime::Tensor& k, const runtime::Tensor& v, const runtime::Tensor& cu_half,
                                   const runtime::Tensor& out, const runtime::Tensor& dout, const runtime::Tensor& lse,
                                   runtime::Tensor& dq, runtime::Tensor& dk, runtime::Tensor& dv);

}  // namespace tessera::model
