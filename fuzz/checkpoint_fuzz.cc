// The checkpoint metadata reader (worker/checkpoint/checkpoint_reader.h) on arbitrary
// metadata.json files over two real shard files: bad structure, splits, bounds, file
// names, sizes and sums are refused with a status — never a crash or an out-of-bounds
// write while assembling a tensor. "@SHA0@", "@SHA1@", "@BYTES0@" and "@BYTES1@" in the
// input stand for the shard files' real sums and sizes, so that mutations get past the
// integrity check to the shard arithmetic.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_replace.h"
#include "common/util.h"
#include "worker/checkpoint/checkpoint_reader.h"
#include "worker/checkpoint/safetensors.h"

namespace {
using namespace tessera::checkpoint;

struct Fixture {
  std::string dir, sha[2], bytes[2];
  Fixture() {
    dir = "/tmp/tessera-fuzz-ckpt-" + std::to_string(getpid());
    (void)tessera::MakeDirs(dir);
    // A [4, 2] tensor "w" split along dim 0 over TP ranks 0 and 1, and a [4] tensor "b".
    const std::vector<float> w0 = {1, 2, 3, 4}, w1 = {5, 6, 7, 8}, b = {9, 10, 11, 12};
    for (int r = 0; r < 2; ++r) {
      const std::string file = dir + "/rank-0000" + std::to_string(r) + ".safetensors";
      std::vector<TensorToWrite> t = {{"w", "F32", {4}, (r ? w1 : w0).data(), 16}};
      if (r == 0) t.push_back({"b", "F32", {4}, b.data(), 16});
      (void)WriteSafetensors(file, t);
      sha[r] = Sha256File(file).value_or("");
      bytes[r] = std::to_string(tessera::ReadFile(file).value_or("").size());
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Fixture fx;
  const std::string meta = absl::StrReplaceAll(std::string(reinterpret_cast<const char*>(data), size),
      {{"@SHA0@", fx.sha[0]}, {"@SHA1@", fx.sha[1]}, {"@BYTES0@", fx.bytes[0]}, {"@BYTES1@", fx.bytes[1]}});
  if (!tessera::WriteFileAtomic(fx.dir + "/metadata.json", meta).ok()) return 0;
  auto r = CheckpointReader::Open(fx.dir);
  if (!r.ok()) return 0;
  const auto& tensors = (*r)->metadata()["tensors"];
  for (const auto& [name, t] : tensors.items()) {
    // Read each tensor at the shape the metadata claims, when small, and at [4, 2].
    std::vector<int64_t> shape;
    int64_t numel = 1;
    if (t.is_object() && t.contains("shape") && t["shape"].is_array())
      for (const auto& d : t["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > 4096) break;
        shape.push_back(d.get<int64_t>());
        numel *= std::max<int64_t>(1, shape.back());
        if (numel > 4096) break;
      }
    for (const char* part : {"value", "exp_avg", "exp_avg_sq"}) {
      if (numel <= 4096) (void)(*r)->Read(name, part, shape);
      (void)(*r)->Read(name, part, {4, 2});
      // A TP rank's part straight from its shards, whole and a range (ZeRO's slice).
      (void)(*r)->ReadTpShard(name, part, {4, 2}, 0, 2, 1);
      (void)(*r)->ReadTpShard(name, part, {4, 2}, 0, 2, 0, 1, 2);
      (void)(*r)->ReadTpShard(name, part, {4, 2}, -1, 1, 0, 3, 5);
    }
  }
  return 0;
}
