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

absl::StatusOr<std::vector<float>> CheckpointReader::Read(const std::string& name, const std::string& part,
                                                          const std::vector<int64_t>& shape) {
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
  std::vector<float> global(numel);
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> cover;  // tp rank -> [begin, end)
  int64_t tp_dim = -2, tp_size = 0;
  for (const auto& s : shards) {
    int64_t dim, size, rank, begin, len;
    if (!GetInt(s, "tp_dim", &dim) || !GetInt(s, "tp_size", &size) || !GetInt(s, "tp_rank", &rank) ||
        !GetInt(s, "begin", &begin) || !GetInt(s, "len", &len) || !s.contains("file") || !s["file"].is_string() ||
        !s.contains("key") || !s["key"].is_string())
      return bad("a shard lacks file, key, tp_dim, tp_size, tp_rank, begin or len");
    if (tp_dim == -2) tp_dim = dim, tp_size = size;
    if (dim != tp_dim || size != tp_size) return bad("shards disagree on the tensor-parallel split");
    if (dim < -1 || dim >= static_cast<int64_t>(shape.size()) || size < 1 || (dim < 0 && size != 1) ||
        (dim >= 0 && shape[dim] % size != 0) || rank < 0 || rank >= size)
      return bad(absl::StrCat("invalid split (tp_dim ", dim, ", tp_size ", size, ", tp_rank ", rank, ")"));
    const int64_t local_n = numel / size;
    if (begin < 0 || len < 0 || begin > local_n - len)
      return bad(absl::StrCat("shard [", begin, ", +", len, ") outside the ", local_n, " local elements"));
    TESSERA_ASSIGN_OR_RETURN(const SafetensorsReader* r, File(s["file"].get<std::string>()));
    TESSERA_ASSIGN_OR_RETURN(std::vector<float> data, r->ReadF32(s["key"].get<std::string>()));
    if (static_cast<int64_t>(data.size()) != len)
      return bad(absl::StrCat(s["key"].get<std::string>(), " holds ", data.size(), " elements, the metadata says ", len));
    const TpMap map(shape, static_cast<int>(dim), static_cast<int>(size), static_cast<int>(rank), numel);
    for (int64_t k = 0; k < len; ++k) global[map.Global(begin + k)] = data[k];
    cover[rank].push_back({begin, begin + len});
  }
  for (int64_t r = 0; r < tp_size; ++r) {
    auto& c = cover[r];
    std::sort(c.begin(), c.end());
    int64_t at = 0;
    for (auto [b, e] : c) {
      if (b != at) return bad(absl::StrCat("TP rank ", r, "'s elements are not covered exactly once near ", at));
      at = e;
    }
    if (at != numel / tp_size) return bad(absl::StrCat("TP rank ", r, "'s shards end at ", at, " of ", numel / tp_size));
  }
  return global;
}

}  // namespace tessera::checkpoint
