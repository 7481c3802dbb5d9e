// Split-KV tensor-core paged decode (internal to kernels/paged_attention; the public
// launcher is PagedAttentionCuda in paged_attention.h, which dispatches here).
#pragma once
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/paged_attention/paged_attention.h"

namespace tessera::kernels::paged {
// bf16, head_dim 64 or 128, at most 16 query heads per kv head.
bool Supported(const PagedDims& d, DType t);
absl::Status Decode(const void* q, const void* k_cache, const void* v_cache, const int32_t* block_tables,
                    const int32_t* context_lens, void* out, float* lse, const PagedDims& d, cudaStream_t s,
                    DeviceScratch* scratch);
// The same with the q/k pass fused in (PagedAttentionRopeCuda).
absl::Status DecodeRope(const void* q, const PagedRopeArgs& rope, void* k_cache, void* v_cache, const int32_t* block_tables,
                        const int32_t* context_lens, void* out, float* lse, const PagedDims& d, cudaStream_t s,
                        DeviceScratch* scratch);
}  // namespace tessera::kernels::paged
