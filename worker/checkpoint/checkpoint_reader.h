// Reading a committed checkpoint (worker/checkpoint/checkpoint.h for the layout) without
// a model: the metadata is parsed and checked once, then any global tensor is assembled
// from its shards, whatever the layout that wrote it.
//
// Everything read from disk is untrusted: metadata.json's structure, every shard's split
// and bounds (each TP rank's elements covered exactly once), shard file names (plain
// names inside the checkpoint directory), file sizes and SHA-256 sums are checked before
// a value is used; a bad checkpoint is DATA_LOSS naming the file and the tensor, never a
// crash (fuzz/checkpoint_fuzz.cc).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "worker/checkpoint/safetensors.h"

namespace tessera::checkpoint {

inline constexpr char kCheckpointFormat[] = "tessera-checkpoint-1";

// Hex SHA-256 of a file's bytes.
absl::StatusOr<std::string> Sha256File(const std::string& path);

class CheckpointReader {
 public:
  // `path` is a committed step directory (D/step-N). DATA_LOSS when its metadata.json is
  // missing or not a checkpoint's.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& path);
  ~CheckpointReader();

  const std::string& path() const { return path_; }
  int64_t step() const { return step_; }
  // The metadata's "layout" and "model" objects (informational; may be absent).
  const nlohmann::json& metadata() const { return meta_; }
  bool Has(const std::string& name) const;

  // The global tensor `name`'s `part` ("value", "exp_avg" or "exp_avg_sq"), flattened,
  // for a tensor of shape `shape`: NOT_FOUND when the checkpoint lacks the tensor,
  // INVALID_ARGUMENT when it was saved with another shape, DATA_LOSS when its shards or
  // files are bad.
  absl::StatusOr<std::vector<float>> Read(const std::string& name, const std::string& part,
                                          const std::vector<int64_t>& shape);
  // Elements [begin, begin + len) (len -1: to the end) of this tensor-parallel rank's
  // part of it: the slice model::TpShardOf(global, shape, tp_dim, tp_size, tp_rank)
  // takes. When the checkpoint split the tensor the same way, only the shards of this
  // rank that overlap the range are read, straight into place (no global tensor; other
  // ranks' files are not opened; the shards' coverage is still checked from the
  // metadata); otherwise through Read.
  absl::StatusOr<std::vector<float>> ReadTpShard(const std::string& name, const std::string& part,
                                                 const std::vector<int64_t>& shape, int tp_dim, int tp_size,
                                                 int tp_rank, int64_t begin = 0, int64_t len = -1);

 private:
  CheckpointReader() = default;
  struct Shard {  // one entry of a tensor part's shard list in metadata.json
    int64_t dim = -1, size = 1, rank = 0, begin = 0, len = 0;
    std::string file, key;
  };
  absl::StatusOr<std::vector<Shard>> Shards(const std::string& name, const std::string& part,
                                            const std::vector<int64_t>& shape, int64_t* numel);
  absl::Status ReadShard(const Shard& h, int64_t from, int64_t n, float* dst);
  absl::StatusOr<const SafetensorsReader*> File(const std::string& name);
  std::string path_;
  int64_t step_ = -1;
  nlohmann::json meta_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> open_;
};

}  // namespace tessera::checkpoint
