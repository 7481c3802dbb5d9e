#include "common/parallel/pipeline.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tessera::parallel {

absl::StatusOr<std::vector<PipeOp>> PipelineSchedule(Schedule s, int pp, int vpp, int rank, int64_t m) {
  if (pp < 1 || vpp < 1 || rank < 0 || rank >= pp || m < 1)
    return absl::InvalidArgumentError(absl::StrCat("pipeline: rank ", rank, " of pp ", pp, ", vpp ", vpp, ", ", m,
                                                   " micro-batches"));
  if (vpp > 1 && m % pp != 0)
    return absl::InvalidArgumentError(absl::StrCat("pipeline: interleaving (vpp ", vpp, ") needs the micro-batches per step (",
                                                   m, ") to be a multiple of pp (", pp, ")"));
  const int64_t total = m * vpp;
  auto mb = [&](int64_t k) { return vpp == 1 ? k : (k / (int64_t(pp) * vpp)) * pp + k % pp; };
  auto fchunk = [&](int64_t k) { return vpp == 1 ? 0 : static_cast<int>((k / pp) % vpp); };
  auto F = [&](int64_t k) { return PipeOp{true, fchunk(k), mb(k)}; };
  auto B = [&](int64_t k) { return PipeOp{false, vpp - 1 - fchunk(k), mb(k)}; };
  std::vector<PipeOp> ops;
  if (s == Schedule::kGPipe) {
    for (int64_t k = 0; k < total; ++k) ops.push_back(F(k));
    for (int64_t k = 0; k < total; ++k) ops.push_back(B(k));
    return ops;
  }
  const int64_t warmup = std::min<int64_t>(
      total, vpp == 1 ? pp - rank - 1 : int64_t(pp - rank - 1) * 2 + int64_t(vpp - 1) * pp);
  for (int64_t k = 0; k < warmup; ++k) ops.push_back(F(k));
  for (int64_t j = 0; j < total - warmup; ++j) {
    ops.push_back(F(warmup + j));
    ops.push_back(B(j));
  }
  for (int64_t j = total - warmup; j < total; ++j) ops.push_back(B(j));
  return ops;
}

absl::StatusOr<Schedule> ParseSchedule(const std::string& name) {
  if (name == "1f1b" || name.empty()) return Schedule::kOneFOneB;
  if (name == "gpipe") return Schedule::kGPipe;
  return absl::InvalidArgumentError(absl::StrCat("pipeline schedule '", name, "': expected 1f1b or gpipe"));
}

}  // namespace tessera::parallel
