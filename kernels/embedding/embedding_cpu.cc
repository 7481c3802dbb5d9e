#include <cstring>
#include <vector>

#include "kernels/common/host_elem.h"
#include "kernels/embedding/embedding.h"

namespace tessera::kernels {

absl::Status EmbeddingForwardCpu(const int32_t* ids, const void* table, void* out, int64_t n, int64_t rows,
                                 int64_t hidden, int64_t vocab_start, DType t) {
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = ids[i] - vocab_start;
    bool in = r >= 0 && r < rows;
    for (int64_t h = 0; h < hidden; ++h) StoreElem(out, i * hidden + h, in ? LoadElem(table, r * hidden + h, t) : 0.f, t);
  }
  return absl::OkStatus();
}

absl::Status EmbeddingBackwardCpu(const int32_t* ids, const void* dout, float* dtable, int64_t n, int64_t rows,
                                  int64_t hidden, int64_t vocab_start, DType t) {
  std::vector<double> acc(rows * hidden, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = ids[i] - vocab_start;
    if (r < 0 || r >= rows) continue;
    for (int64_t h = 0; h < hidden; ++h) acc[r * hidden + h] += LoadElem(dout, i * hidden + h, t);
  }
  for (int64_t k = 0; k < rows * hidden; ++k) dtable[k] = static_cast<float>(acc[k]);
  return absl::OkStatus();
}

}  // namespace tessera::kernels
