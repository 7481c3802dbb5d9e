#include <algorithm>
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
  // Each touched row's tokens summed in double (in token order), then added once: the
  // row's new value is its old one plus the correctly rounded sum, whatever the order of
  // the rows.
  std::vector<int64_t> order;
  for (int64_t i = 0; i < n; ++i)
    if (const int64_t r = ids[i] - vocab_start; r >= 0 && r < rows) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
  std::vector<double> acc(hidden);
  for (size_t k = 0; k < order.size();) {
    const int32_t id = ids[order[k]];
    std::fill(acc.begin(), acc.end(), 0.0);
    for (; k < order.size() && ids[order[k]] == id; ++k)
      for (int64_t h = 0; h < hidden; ++h) acc[h] += LoadElem(dout, order[k] * hidden + h, t);
    float* row = dtable + (id - vocab_start) * hidden;
    for (int64_t h = 0; h < hidden; ++h) row[h] += static_cast<float>(acc[h]);
  }
  return absl::OkStatus();
}

}  // namespace tessera::kernels
