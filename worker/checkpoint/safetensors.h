// The safetensors format (Hugging Face): an 8-byte little-endian header size N, N bytes
// of JSON — {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
// "__metadata__": {"<key>": "<string>"}} — then the data, offsets relative to its start.
// Used for checkpoint shards and for Hugging Face imports and exports.
//
// Reading validates the whole header before anything is read: the size fits the file,
// the JSON parses, every dtype is known, shapes are non-negative, each tensor's byte
// range matches its shape, lies inside the file and overlaps no other. A corrupt or
// truncated file is an error naming the file and the tensor, never an out-of-bounds read.
//
// Threading: a reader may be used from several threads (pread on one descriptor).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::checkpoint {

struct TensorInfo {
  std::string dtype;  // "F32", "BF16", "F16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL"
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section
  int64_t numel() const;
};

class SafetensorsReader {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path);
  ~SafetensorsReader();
  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // NOT_FOUND naming the tensor and the file when absent.
  absl::StatusOr<const TensorInfo*> Find(const std::string& name) const;
  // The tensor's values as f32 (from F32, BF16 or F16; others are an error).
  absl::StatusOr<std::vector<float>> ReadF32(const std::string& name) const;
  // Elements [offset, offset + n) of the flattened tensor into dst (INVALID_ARGUMENT when
  // the range is not inside it).
  absl::Status ReadF32RangeInto(const std::string& name, size_t offset, float* dst, size_t n) const;
  // Slice `index` of `parts` along dim (0: a block of rows, read as one range; 1: a block
  // of columns of a matrix, read row by row; dim < 0 or parts 1: all of it) as f32 into
  // dst (numel / parts elements) — what one tensor-parallel rank holds, without reading
  // the rest (INVALID_ARGUMENT when the shape does not split so).
  absl::Status ReadF32SliceInto(const std::string& name, int dim, int parts, int index, float* dst) const;
  // The same slice's bytes as stored (F32, BF16 or F16: numel / parts elements of the
  // tensor's dtype into dst), without conversion.
  absl::Status ReadRawSliceInto(const std::string& name, int dim, int parts, int index, void* dst) const;
  // That slice seen as rows, the unit of a partial read: {rows, elements per row}. Along
  // dim 0, the block's rows of the trailing dims; along dim 1, every row's block of
  // columns; unsplit, the tensor's rows (a 1-D tensor's elements, a scalar's one).
  // INVALID_ARGUMENT as for the reads when the shape does not split so.
  absl::StatusOr<std::pair<int64_t, int64_t>> SliceRows(const std::string& name, int dim, int parts) const;
  // Rows [begin, end) of the slice as stored, into dst ((end - begin) rows).
  absl::Status ReadRawSliceRowsInto(const std::string& name, int dim, int parts, int index, int64_t begin, int64_t end,
                                    void* dst) const;

 private:
  // Elements [offset, offset + n) of t (bounds checked by the caller), converted to f32;
  // raw: a staging buffer for 16-bit sources.
  absl::Status ReadRange(const std::string& name, const TensorInfo& t, size_t offset, float* dst, size_t n,
                         std::vector<uint16_t>& raw) const;
  SafetensorsReader(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  absl::Status ParseHeader(uint64_t file_size);
  std::string path_;
  int fd_;
  uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  std::string dtype;  // "F32" or "BF16" (data already in that format)
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;  // must equal numel * the dtype's size
  // Instead of `data`: called when the writer reaches this tensor, returns its bytes
  // (valid until the next tensor's `produce` is called), so that a writer streams tensors
  // it has not read yet instead of holding all of them.
  std::function<absl::StatusOr<const void*>()> produce;
};

// Writes a safetensors file (tensors in the given order, 8-byte aligned header) and
// fsyncs it. Not atomic by itself: checkpoints write into a temporary directory. With
// `sha256`, the hex SHA-256 of the whole file, computed as it is written.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {},
                              std::string* sha256 = nullptr);

// Bytes per element of a safetensors dtype name; 0 if unknown.
int SafetensorsDTypeSize(const std::string& dtype);

}  // namespace tessera::checkpoint
