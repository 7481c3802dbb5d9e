#include "worker/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <openssl/evp.h>

#include <memory>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "common/dtype.h"

namespace tessera::checkpoint {
namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;  // as Hugging Face's reader

absl::Status PreadAll(int fd, void* dst, size_t bytes, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::DataLossError(absl::StrCat(path, ": read failed: ", strerror(errno)));
    if (n == 0) return absl::DataLossError(absl::StrCat(path, ": file ends early (truncated?)"));
    p += n, bytes -= static_cast<size_t>(n), offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const void* src, size_t bytes, const std::string& path) {
  const auto* p = static_cast<const char*>(src);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
    p += n, bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

int SafetensorsDTypeSize(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "BF16" || d == "F16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL") return 1;
  return 0;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsReader::~SafetensorsReader() { ::close(fd_); }

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  std::unique_ptr<SafetensorsReader> r(new SafetensorsReader(path, fd));
  struct stat st {};
  if (::fstat(fd, &st) != 0) return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", strerror(errno)));
  TESSERA_RETURN_IF_ERROR(r->ParseHeader(static_cast<uint64_t>(st.st_size)));
  return r;
}

absl::Status SafetensorsReader::ParseHeader(uint64_t file_size) {
  auto bad = [&](const std::string& what) { return absl::DataLossError(absl::StrCat(path_, ": not a valid safetensors file: ", what)); };
  if (file_size < 8) return bad(absl::StrCat("only ", file_size, " bytes"));
  unsigned char len_bytes[8];
  TESSERA_RETURN_IF_ERROR(PreadAll(fd_, len_bytes, 8, 0, path_));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > kMaxHeader || n > file_size - 8) return bad(absl::StrCat("header size ", n, " for a file of ", file_size, " bytes"));
  std::string text(n, '\0');
  TESSERA_RETURN_IF_ERROR(PreadAll(fd_, text.data(), n, 8, path_));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("the header is not a JSON object");
  data_start_ = 8 + n;
  const uint64_t data_size = file_size - data_start_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) return bad("__metadata__ is not an object");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) return bad(absl::StrCat("__metadata__.", k, " is not a string"));
        metadata_[k] = s.get<std::string>();
      }
      continue;
    }
    const std::string& tensor = name;  // (a lambda cannot capture a structured binding before C++20 in clang 14)
    auto tbad = [&](const std::string& what) { return bad(absl::StrCat("tensor '", tensor, "': ", what)); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      return tbad("needs dtype, shape and data_offsets");
    TensorInfo t;
    if (!v["dtype"].is_string()) return tbad("dtype is not a string");
    t.dtype = v["dtype"].get<std::string>();
    const int size = SafetensorsDTypeSize(t.dtype);
    if (size == 0) return tbad(absl::StrCat("unknown dtype ", t.dtype));
    if (!v["shape"].is_array()) return tbad("shape is not an array");
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return tbad("shape has a negative or non-integer size");
      const auto dim = static_cast<uint64_t>(d.get<int64_t>());
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / 8 / dim) return tbad("shape too large");
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return tbad("data_offsets is not [begin, end]");
    t.begin = off[0].get<uint64_t>(), t.end = off[1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_size)
      return tbad(absl::StrCat("bytes [", t.begin, ", ", t.end, ") outside the ", data_size, " data bytes (truncated?)"));
    if (t.end - t.begin != numel * static_cast<uint64_t>(size))
      return tbad(absl::StrCat(t.end - t.begin, " bytes for shape [", absl::StrJoin(t.shape, ", "), "] of ", t.dtype));
    ranges.emplace_back(t.begin, t.end);
    tensors_[name] = std::move(t);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) return bad("two tensors' byte ranges overlap");
  return absl::OkStatus();
}

absl::StatusOr<const TensorInfo*> SafetensorsReader::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "'"));
  return &it->second;
}

absl::StatusOr<std::vector<float>> SafetensorsReader::ReadF32(const std::string& name) const {
  TESSERA_ASSIGN_OR_RETURN(const TensorInfo* t, Find(name));
  std::vector<float> out(static_cast<size_t>(t->numel()));
  TESSERA_RETURN_IF_ERROR(ReadF32RangeInto(name, 0, out.data(), out.size()));
  return out;
}

absl::Status SafetensorsReader::ReadF32RangeInto(const std::string& name, size_t offset, float* dst, size_t n) const {
  TESSERA_ASSIGN_OR_RETURN(const TensorInfo* t, Find(name));
  const size_t numel = static_cast<size_t>(t->numel());
  if (offset > numel || n > numel - offset)
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", name, "' holds ", numel, " elements; asked for [",
                                                   offset, ", +", n, ")"));
  std::vector<uint16_t> raw;
  return ReadRange(name, *t, offset, dst, n, raw);
}

absl::Status SafetensorsReader::ReadRange(const std::string& name, const TensorInfo& t, size_t offset, float* dst,
                                          size_t n, std::vector<uint16_t>& raw) const {
  if (t.dtype == "F32") return PreadAll(fd_, dst, n * 4, data_start_ + t.begin + offset * 4, path_);
  const bool bf16 = t.dtype == "BF16";
  if (!bf16 && t.dtype != "F16")
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", name, "' is ", t.dtype, ", expected F32, BF16 or F16"));
  // Converted in chunks of at most 4 Mi elements (the staging buffer stays small).
  constexpr size_t kChunk = size_t{1} << 22;
  raw.resize(std::min(n, kChunk));
  for (size_t done = 0; done < n;) {
    const size_t k = std::min(n - done, kChunk);
    TESSERA_RETURN_IF_ERROR(PreadAll(fd_, raw.data(), k * 2, data_start_ + t.begin + (offset + done) * 2, path_));
    float* out = dst + done;
    if (bf16) {
      for (size_t i = 0; i < k; ++i) {  // a shift: vectorized
        const uint32_t u = static_cast<uint32_t>(raw[i]) << 16;
        std::memcpy(out + i, &u, 4);
      }
    } else {
      for (size_t i = 0; i < k; ++i) out[i] = tessera::F16ToFloat(raw[i]);
    }
    done += k;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<int64_t, int64_t>> SafetensorsReader::SliceRows(const std::string& name, int dim,
                                                                           int parts) const {
  TESSERA_ASSIGN_OR_RETURN(const TensorInfo* t, Find(name));
  const int64_t numel = t->numel();
  if (dim < 0 || parts <= 1) {
    const int64_t rows = t->shape.empty() ? 1 : t->shape[0];
    return std::pair<int64_t, int64_t>{rows, rows == 0 ? 0 : numel / rows};
  }
  const bool ok = (dim == 0 && !t->shape.empty() && t->shape[0] % parts == 0) ||
                  (dim == 1 && t->shape.size() == 2 && t->shape[1] % parts == 0);
  if (!ok)
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", name, "' [", absl::StrJoin(t->shape, ", "),
                                                   "] does not split into ", parts, " along dim ", dim));
  if (dim == 0) return std::pair<int64_t, int64_t>{t->shape[0] / parts, t->shape[0] == 0 ? 0 : numel / t->shape[0]};
  return std::pair<int64_t, int64_t>{t->shape[0], t->shape[1] / parts};
}

absl::Status SafetensorsReader::ReadRawSliceRowsInto(const std::string& name, int dim, int parts, int index,
                                                     int64_t begin, int64_t end, void* dst) const {
  TESSERA_ASSIGN_OR_RETURN(const TensorInfo* t, Find(name));
  const int64_t elem = t->dtype == "F32" ? 4 : t->dtype == "BF16" || t->dtype == "F16" ? 2 : 0;
  if (elem == 0)
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", name, "' is ", t->dtype, ", expected F32, BF16 or F16"));
  TESSERA_ASSIGN_OR_RETURN(const auto rows, SliceRows(name, dim, parts));
  const bool split = dim >= 0 && parts > 1;
  if ((split && (index < 0 || index >= parts)) || begin < 0 || begin > end || end > rows.first)
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", name, "' [", absl::StrJoin(t->shape, ", "),
                                                   "] has no rows [", begin, ", ", end, ") of slice ", index, " of ", parts,
                                                   " along dim ", dim));
  char* out = static_cast<char*>(dst);
  const uint64_t base = data_start_ + t->begin;
  const int64_t row_bytes = rows.second * elem;
  if (!split || dim == 0) {  // one range
    const int64_t first = (split ? index * rows.first : 0) + begin;
    return PreadAll(fd_, out, static_cast<size_t>((end - begin) * row_bytes), base + first * row_bytes, path_);
  }
  const int64_t cols = t->shape[1];
  for (int64_t r = begin; r < end; ++r)
    TESSERA_RETURN_IF_ERROR(PreadAll(fd_, out + (r - begin) * row_bytes, static_cast<size_t>(row_bytes),
                                     base + (r * cols + index * rows.second) * elem, path_));
  return absl::OkStatus();
}

absl::Status SafetensorsReader::ReadRawSliceInto(const std::string& name, int dim, int parts, int index,
                                                 void* dst) const {
  TESSERA_ASSIGN_OR_RETURN(const auto rows, SliceRows(name, dim, parts));
  return ReadRawSliceRowsInto(name, dim, parts, index, 0, rows.first, dst);
}

absl::Status SafetensorsReader::ReadF32SliceInto(const std::string& name, int dim, int parts, int index,
                                                 float* dst) const {
  TESSERA_ASSIGN_OR_RETURN(const TensorInfo* t, Find(name));
  const size_t numel = static_cast<size_t>(t->numel());
  std::vector<uint16_t> raw;
  if (dim < 0 || parts <= 1) return ReadRange(name, *t, 0, dst, numel, raw);
  const bool ok = (dim == 0 && !t->shape.empty() && t->shape[0] % parts == 0) ||
                  (dim == 1 && t->shape.size() == 2 && t->shape[1] % parts == 0);
  if (!ok || index < 0 || index >= parts)
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", name, "' [", absl::StrJoin(t->shape, ", "),
                                                   "] has no slice ", index, " of ", parts, " along dim ", dim));
  if (dim == 0) {  // a block of rows: one range
    const size_t n = numel / parts;
    return ReadRange(name, *t, index * n, dst, n, raw);
  }
  const size_t rows = static_cast<size_t>(t->shape[0]), cols = static_cast<size_t>(t->shape[1]), c = cols / parts;
  for (size_t r = 0; r < rows; ++r) TESSERA_RETURN_IF_ERROR(ReadRange(name, *t, r * cols + index * c, dst + r * c, c, raw));
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata, std::string* sha256) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const int size = SafetensorsDTypeSize(t.dtype);
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (size == 0 || t.bytes != static_cast<uint64_t>(numel) * size || t.name == "__metadata__" || header.contains(t.name))
      return absl::InvalidArgumentError(absl::StrCat("safetensors ", path, ": tensor '", t.name, "' (", t.dtype, ", ",
                                                     t.bytes, " bytes) is invalid or repeated"));
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", path, ": ", strerror(errno)));
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> md(sha256 ? EVP_MD_CTX_new() : nullptr, EVP_MD_CTX_free);
  if (md) EVP_DigestInit_ex(md.get(), EVP_sha256(), nullptr);
  auto put = [&](const void* data, size_t bytes) {
    if (md) EVP_DigestUpdate(md.get(), data, bytes);
    return WriteAll(fd, data, bytes, path);
  };
  absl::Status st = put(len_bytes, 8);
  if (st.ok()) st = put(text.data(), text.size());
  for (size_t i = 0; st.ok() && i < tensors.size(); ++i) {
    const void* data = tensors[i].data;
    if (tensors[i].produce) {
      absl::StatusOr<const void*> made = tensors[i].produce();
      if (!made.ok()) st = made.status();
      else data = *made;
    }
    if (st.ok()) st = put(data, tensors[i].bytes);
  }
  if (st.ok() && ::fsync(fd) != 0) st = absl::InternalError(absl::StrCat("cannot sync ", path, ": ", strerror(errno)));
  if (::close(fd) != 0 && st.ok()) st = absl::InternalError(absl::StrCat("cannot close ", path, ": ", strerror(errno)));
  if (st.ok() && md) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(md.get(), digest, &len);
    sha256->clear();
    for (unsigned k = 0; k < len; ++k) absl::StrAppendFormat(sha256, "%02x", digest[k]);
  }
  return st;
}

}  // namespace tessera::checkpoint
