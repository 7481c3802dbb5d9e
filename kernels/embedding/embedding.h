// Vocab-parallel embedding: this rank holds rows [vocab_start, vocab_start + rows) of the
// table. Forward: out[i] = table[id_i - vocab_start] when the id is in range, else 0
// (the TP all-reduce then sums the shards). Backward: dtable[id_i - vocab_start] += dout[i]
// for in-range ids (dtable f32, added to: it is the parameter's gradient, accumulated over
// micro-batches, so no full-size temporary is zeroed and added per micro-batch — 1 GiB for
// a 128k-vocabulary, 2048-wide table). Ids are not range-checked against the
// global vocabulary here (that would cost a device sync): tokenizers and data loaders
// validate ids where data enters.
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace tessera::kernels {
absl::Status EmbeddingForwardCpu(const int32_t* ids, const void* table, void* out, int64_t n, int64_t rows,
                                 int64_t hidden, int64_t vocab_start, DType t);
absl::Status EmbeddingBackwardCpu(const int32_t* ids, const void* dout, float* dtable, int64_t n, int64_t rows,
                                  int64_t hidden, int64_t vocab_start, DType t);
absl::Status EmbeddingForwardCuda(const int32_t* ids, const void* table, void* out, int64_t n, int64_t rows,
                                  int64_t hidden, int64_t vocab_start, DType t, void* stream);
absl::Status EmbeddingBackwardCuda(const int32_t* ids, const void* dout, float* dtable, int64_t n, int64_t rows,
                                   int64_t hidden, int64_t vocab_start, DType t, void* stream);
}  // namespace tessera::kernels
