// CPU reference of the fused q/k pass (see the header): the three ops it fuses.
#include <algorithm>
#include <vector>

#include "common/dtype.h"
#include "kernels/decode/qk_rope_cache.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"

namespace tessera::kernels {

absl::Status QkRopeCacheCpu(const QkRopeCacheArgs& a, DType t) {
  const int64_t d = a.head_dim, es = DTypeSize(t);
  const void* q = a.q;
  const void* k = a.k;
  std::vector<char> qn, kn;
  std::vector<float> rstd;
  if (a.q_norm != nullptr) {
    qn.resize(a.tokens * a.q_heads * d * es), kn.resize(a.tokens * a.kv_heads * d * es);
    rstd.resize(a.tokens * std::max(a.q_heads, a.kv_heads));
    if (auto s = RmsNormForwardCpu(a.q, a.q_norm, qn.data(), rstd.data(), a.tokens * a.q_heads, d, a.eps, t); !s.ok()) return s;
    if (auto s = RmsNormForwardCpu(a.k, a.k_norm, kn.data(), rstd.data(), a.tokens * a.kv_heads, d, a.eps, t); !s.ok()) return s;
    q = qn.data(), k = kn.data();
  }
  if (auto s = RopeCpu(q, a.pos, a.q_out, a.tokens, a.q_heads, d, a.inv_freq, a.scale, 1.f, t, a.q_heads * d, a.q_heads * d);
      !s.ok())
    return s;
  std::vector<char> kr(a.tokens * a.kv_heads * d * es);
  if (auto s = RopeCpu(k, a.pos, kr.data(), a.tokens, a.kv_heads, d, a.inv_freq, a.scale, 1.f, t, a.kv_heads * d,
                       a.kv_heads * d);
      !s.ok())
    return s;
  if (a.k_out != nullptr) std::copy(kr.begin(), kr.end(), static_cast<char*>(a.k_out));
  return KvCacheWriteCpu(kr.data(), a.v, a.slots, a.k_cache, a.v_cache, a.tokens, a.kv_heads * d * es);
}

}  // namespace tessera::kernels
