#include "worker/checkpoint/checkpoint_reader.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "common/util.h"

namespace tessera::checkpoint {
namespace {
using nlohmann::json;

bool GetInt(const json& j, const char* key, int64_t* out) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return false;
  *out = j[key].get<int64_t>();
  return true;
}

// Global index of element `li` of TP rank r's flattened local tensor (split along dim d
// into t parts).
struct TpMap {
  int64_t outer = 1, dim = 1, inner = 1, parts = 1, rank = 0;
  TpMap(const std::vector<int64_t>& shape, int d, int t, int r, int64_t numel) : parts(t), rank(r) {
    if (d < 0) {
      dim = numel, parts = 1, rank = 0;
      return;
    }
    for (int i = 0; i < d; ++i) outer *= shape[i];
    dim = shape[d];
    for (size_t i = d + 1; i < shape.size(); ++i) inner *= shape[i];
  }
  int64_t Global(int64_t li) const {
    const int64_t dl = dim / parts, o = li / (dl * inner), rem = li % (dl * inner);
    return (o * dim + rank * dl + rem / inner) * inner + rem % inner;
  }
};

}  // namespace

absl::StatusOr<std::string> Sha256File(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return absl::DataLossError(absl::StrCat("cannot read ", path, ": ", strerror(e)));
    }
    if (n == 0) break;
    EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) absl::StrAppendFormat(&hex, "%02x", md[i]);
  return hex;
}

CheckpointReader::~CheckpointReader() = default;

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& path) {
  auto text = ReadFile(path + "/metadata.json");
  if (!text.ok()) return absl::DataLossError(absl::StrCat(path, "/metadata.json: ", text.status().message()));
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  r->path_ = path;
  r->meta_ = json::parse(*text, nullptr, false);
  const json& m = r->meta_;
  if (m.is_discarded() || !m.is_object() || !m.contains("format") || m["format"] != kCheckpointFormat ||
      !GetInt(m, "step", &r->step_) || r->step_ < 0 || !m.contains("tensors") || !m["tensors"].is_object() ||
      !m.contains("files") || !m["files"].is_object())
    return absl::DataLossError(absl::StrCat(path, "/metadata.json: not a ", kCheckpointFormat, " metadata file"));
  return r;
}

bool CheckpointReader::Has(const std::string& name) const { return meta_["tensors"].contains(name); }

// A shard file: opened once, its size and SHA-256 checked on first use.
absl::StatusOr<const SafetensorsReader*> CheckpointReader::File(const std::string& name) {
  if (auto it = open_.find(name); it != open_.end()) return it->second.get();
  if (name.find('/') != std::string::npos || name.empty() || name[0] == '.')
    return absl::DataLossError(absl::StrCat(path_, ": bad shard file name '", name, "'"));
  const json& listing = meta_["files"];
  int64_t bytes = -1;
  if (!listing.contains(name) || !GetInt(listing[name], "bytes", &bytes) || !listing[name].contains("sha256") ||
      !listing[name]["sha256"].is_string())
    return absl::DataLossError(absl::StrCat(path_, "/metadata.json: no size and sha256 for ", name));
  const std::string file = absl::StrCat(path_, "/", name);
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return absl::DataLossError(absl::StrCat(file, ": missing"));
  if (st.st_size != bytes)
    return absl::DataLossError(absl::StrCat(file, ": ", st.st_size, " bytes, the metadata says ", bytes, " (truncated?)"));
  TESSERA_ASSIGN_OR_RETURN(std::string sha, Sha256File(file));
  if (sha != listing[name]["sha256"].get<std::string>())
    return absl::DataLossError(absl::StrCat(file, ": SHA-256 mismatch (the file is corrupt)"));
  TESSERA_ASSIGN_OR_RETURN(auto reader, SafetensorsReader::Open(file));
  return (open_[name] = std::move(reader)).get();
}

// The shards of `name`'s `part`, validated against the expected shape (no data read).
absl::StatusOr<std::vector<CheckpointReader::Shard>> CheckpointReader::Shards(const std::string& name,
                                                                            const std::string& part,
                                                                            const std::vector<int64_t>& shape,
                                                                            int64_t* numel_out) {
  constexpr int64_t kMaxElements = int64_t{1} << 40;
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 1 || d > kMaxElements / numel)
      return absl::InvalidArgumentError(absl::StrCat("checkpoint ", path_, ": ", name, ": bad expected shape [",
                                                     absl::StrJoin(shape, ", "), "]"));
    numel *= d;
  }
  const json& tensors = meta_["tensors"];
  if (!tensors.contains(name)) return absl::NotFoundError(absl::StrCat("checkpoint ", path_, " has no tensor ", name));
  const json& t = tensors[name];
  std::vector<int64_t> saved;
  if (t.is_object() && t.contains("shape") && t["shape"].is_array())
    for (const auto& d : t["shape"])
      if (d.is_number_integer()) saved.push_back(d.get<int64_t>());
  if (saved != shape)
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", path_, ": ", name, " has shape [",
                                                   absl::StrJoin(saved, ", "), "], the model expects [",
                                                   absl::StrJoin(shape, ", "), "]"));
  if (!t.contains(part)) return absl::DataLossError(absl::StrCat("checkpoint ", path_, ": ", name, " has no ", part));
  const json& shards = t[part];
  const std::string what = absl::StrCat(name, " ", part);
  auto bad = [&](const std::string& why) { return absl::DataLossError(absl::StrCat("checkpoint: ", what, ": ", why)); };
  if (!shards.is_array() || shards.empty()) return bad("no shards");
  std::vector<Shard> out;
  for (const auto& s : shards) {
    Shard h;
    if (!GetInt(s, "tp_dim", &h.dim) || !GetInt(s, "tp_size", &h.size) || !GetInt(s, "tp_rank", &h.rank) ||
        !GetInt(s, "begin", &h.begin) || !GetInt(s, "len", &h.len) || !s.contains("file") || !s["file"].is_string() ||
        !s.contains("key") || !s["key"].is_string())
      return bad("a shard lacks file, key, tp_dim, tp_size, tp_rank, begin or len");
    if (!out.empty() && (h.dim != out[0].dim || h.size != out[0].size)) return bad("shards disagree on the tensor-parallel split");
    if (h.dim < -1 || h.dim >= static_cast<int64_t>(shape.size()) || h.size < 1 || (h.dim < 0 && h.size != 1) ||
        (h.dim >= 0 && shape[h.dim] % h.size != 0) || h.rank < 0 || h.rank >= h.size)
      return bad(absl::StrCat("invalid split (tp_dim ", h.dim, ", tp_size ", h.size, ", tp_rank ", h.rank, ")"));
    const int64_t local_n = numel / h.size;
    if (h.begin < 0 || h.len < 0 || h.begin > local_n - h.len)
      return bad(absl::StrCat("shard [", h.begin, ", +", h.len, ") outside the ", local_n, " local elements"));
    h.file = s["file"].get<std::string>();
    h.key = s["key"].get<std::string>();
    out.push_back(std::move(h));
  }
  *numel_out = numel;
  return out;
}

namespace {
// Whether the shards of TP rank `rank` cover its `n` local elements exactly once.
absl::Status CheckCover(std::vector<std::pair<int64_t, int64_t>> ranges, int64_t n, int64_t rank,
                        const std::string& what) {
  std::sort(ranges.begin(), ranges.end());
  int64_t at = 0;
  for (auto [b, e] : ranges) {
    if (b != at)
      return absl::DataLossError(
          absl::StrCat("checkpoint: ", what, ": TP rank ", rank, "'s elements are not covered exactly once near ", at));
    at = e;
  }
  if (at != n)
    return absl::DataLossError(absl::StrCat("checkpoint: ", what, ": TP rank ", rank, "'s shards end at ", at, " of ", n));
  return absl::OkStatus();
}
}  // namespace

// Elements [from, from + n) of shard h into dst, once its file checks out and its tensor
// holds the h.len elements the metadata says (both paths read through here).
absl::Status CheckpointReader::ReadShard(const Shard& h, int64_t from, int64_t n, float* dst) {
  TESSERA_ASSIGN_OR_RETURN(const SafetensorsReader* r, File(h.file));
  TESSERA_ASSIGN_OR_RETURN(const TensorInfo* t, r->Find(h.key));
  if (t->numel() != h.len)
    return absl::DataLossError(absl::StrCat("checkpoint ", path_, ": ", h.key, " holds ", t->numel(),
                                            " elements, the metadata says ", h.len));
  return r->ReadF32RangeInto(h.key, static_cast<size_t>(from), dst, static_cast<size_t>(n));
}

absl::StatusOr<std::vector<float>> CheckpointReader::Read(const std::string& name, const std::string& part,
                                                          const std::vector<int64_t>& shape) {
  int64_t numel = 0;
  TESSERA_ASSIGN_OR_RETURN(std::vector<Shard> shards, Shards(name, part, shape, &numel));
  const std::string what = absl::StrCat(name, " ", part);
  std::vector<float> global(numel);
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> cover;  // tp rank -> [begin, end)
  std::vector<float> data;
  for (const Shard& h : shards) {
    data.resize(static_cast<size_t>(h.len));
    TESSERA_RETURN_IF_ERROR(ReadShard(h, 0, h.len, data.data()));
    const TpMap map(shape, static_cast<int>(h.dim), static_cast<int>(h.size), static_cast<int>(h.rank), numel);
    for (int64_t k = 0; k < h.len; ++k) global[map.Global(h.begin + k)] = data[k];
    cover[h.rank].push_back({h.begin, h.begin + h.len});
  }
  for (int64_t r = 0; r < shards[0].size; ++r) TESSERA_RETURN_IF_ERROR(CheckCover(cover[r], numel / shards[0].size, r, what));
  return global;
}

absl::StatusOr<std::vector<float>> CheckpointReader::ReadTpShard(const std::string& name, const std::string& part,
                                                                 const std::vector<int64_t>& shape, int tp_dim,
                                                                 int tp_size, int tp_rank, int64_t begin, int64_t len) {
  const int dim = tp_size > 1 ? tp_dim : -1, size = dim >= 0 ? tp_size : 1, rank = dim >= 0 ? tp_rank : 0;
  int64_t numel = 0;
  TESSERA_ASSIGN_OR_RETURN(std::vector<Shard> shards, Shards(name, part, shape, &numel));
  const int64_t n = numel / size;
  if (len < 0) len = n - begin;
  if (begin < 0 || len < 0 || begin > n - len)
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", name, " ", part, ": [", begin, ", +", len,
                                                   ") is outside the ", n, " elements of a TP rank's part"));
  if (shards[0].dim != dim || shards[0].size != size) {  // saved under another split: through the global tensor
    TESSERA_ASSIGN_OR_RETURN(std::vector<float> global, Read(name, part, shape));
    const TpMap map(shape, dim, size, rank, numel);  // this rank's local element -> global
    std::vector<float> out(static_cast<size_t>(len));
    for (int64_t k = 0; k < len; ++k) out[k] = global[map.Global(begin + k)];
    return out;
  }
  std::vector<std::pair<int64_t, int64_t>> cover;
  for (const Shard& h : shards)
    if (h.rank == rank) cover.push_back({h.begin, h.begin + h.len});
  TESSERA_RETURN_IF_ERROR(CheckCover(cover, n, rank, absl::StrCat(name, " ", part)));
  std::vector<float> out(static_cast<size_t>(len));
  for (const Shard& h : shards) {
    const int64_t from = std::max(h.begin, begin), to = std::min(h.begin + h.len, begin + len);
    if (h.rank != rank || from >= to) continue;
    TESSERA_RETURN_IF_ERROR(ReadShard(h, from - h.begin, to - from, out.data() + (from - begin)));
  }
  return out;
}

}  // namespace tessera::checkpoint
