#include <cstring>
#include <cmath>
#include <vector>

#include "kernels/common/host_elem.h"
#include "kernels/paged_attention/paged_attention.h"

namespace tessera::kernels {

absl::Status PagedAttentionCpu(const void* q, const void* kc, const void* vc, const int32_t* tables, const int32_t* lens,
                               void* out, float* lse, const PagedDims& d, DType t) {
  const int64_t D = d.head_dim, group = d.q_heads / d.kv_heads;
  std::vector<double> s, acc(D);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.q_heads; ++h) {
      const int64_t g = h / group, n = lens[b];
      s.assign(n, 0.0);
      double m = -INFINITY;
      auto slot = [&](int64_t tok) {
        int64_t blk = tables[b * d.max_blocks + tok / d.block_size];
        return ((blk * d.block_size + tok % d.block_size) * d.kv_heads + g) * D;
      };
      for (int64_t tok = 0; tok < n; ++tok) {
        double dot = 0;
        for (int64_t c = 0; c < D; ++c) dot += double(LoadElem(q, (b * d.q_heads + h) * D + c, t)) * LoadElem(kc, slot(tok) + c, t);
        s[tok] = dot * d.scale;
        m = std::max(m, s[tok]);
      }
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t tok = 0; tok < n; ++tok) {
        double p = std::exp(s[tok] - m);
        sum += p;
        for (int64_t c = 0; c < D; ++c) acc[c] += p * LoadElem(vc, slot(tok) + c, t);
      }
      for (int64_t c = 0; c < D; ++c) StoreElem(out, (b * d.q_heads + h) * D + c, static_cast<float>(acc[c] / sum), t);
      lse[b * d.q_heads + h] = static_cast<float>(m + std::log(sum));
    }
  return absl::OkStatus();
}

absl::Status KvCacheWriteCpu(const void* k, const void* v, const int32_t* slots, void* k_cache, void* v_cache,
                             int64_t tokens, int64_t row_bytes) {
  for (int64_t i = 0; i < tokens; ++i) {
    std::memcpy(static_cast<char*>(k_cache) + slots[i] * row_bytes, static_cast<const char*>(k) + i * row_bytes, row_bytes);
    std::memcpy(static_cast<char*>(v_cache) + slots[i] * row_bytes, static_cast<const char*>(v) + i * row_bytes, row_bytes);
  }
  return absl::OkStatus();
}

}  // namespace tessera::kernels
