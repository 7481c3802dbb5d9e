// Load and save speed of a Hugging Face model directory against the disk it sits on:
//   hf_io_bench DIR OUT cpu|cuda f32|bf16 [MAX_SHARD_BYTES]
// 1. disk: each weight file evicted from the page cache (posix_fadvise DONTNEED), then
//    read sequentially (16 MiB reads, one thread): the disk's read speed;
// 2. import cold: the files evicted again, checkpoint::ImportHf into a model on DEVICE
//    (the residency of the files' pages before it is printed: mincore);
// 3. import warm: ImportHf again, the files now in the page cache;
// 4. export: checkpoint::ExportHf(OUT, "BF16", sharded above MAX_SHARD_BYTES, default 5 GiB),
//    fsynced, as bytes written per second.
// GB/s are of the weight files' bytes (10^9). Prints one JSON line.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/util.h"
#include "worker/checkpoint/hf.h"
#include "worker/model/llama.h"

using namespace tessera;

namespace {
int Fail(const absl::Status& s) {
  fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}
double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The directory's weight files (the index's, or model.safetensors).
std::vector<std::string> WeightFiles(const std::string& dir) {
  std::vector<std::string> files;
  if (auto index = ReadFile(dir + "/model.safetensors.index.json"); index.ok()) {
    std::map<std::string, bool> seen;
    const nlohmann::json j = nlohmann::json::parse(*index);  // alive through the loop
    for (const auto& [name, file] : j["weight_map"].items())
      if (!seen[file.get<std::string>()]) seen[file.get<std::string>()] = true, files.push_back(dir + "/" + file.get<std::string>());
  } else {
    files.push_back(dir + "/model.safetensors");
  }
  return files;
}

int64_t Size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

void Evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Fraction of the file's pages in the page cache.
double Resident(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return -1;
  const int64_t size = Size(path);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return -1;
  const int64_t page = ::sysconf(_SC_PAGESIZE), pages = (size + page - 1) / page;
  std::vector<unsigned char> in(pages);
  double frac = -1;
  if (::mincore(p, size, in.data()) == 0) {
    int64_t n = 0;
    for (unsigned char c : in) n += c & 1;
    frac = static_cast<double>(n) / static_cast<double>(pages);
  }
  ::munmap(p, size);
  return frac;
}

double ReadAll(const std::string& path) {  // seconds
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return -1;
  std::vector<char> buf(size_t{16} << 20);
  const auto t0 = std::chrono::steady_clock::now();
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  const double s = Since(t0);
  ::close(fd);
  return s;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    fprintf(stderr, "usage: hf_io_bench DIR OUT cpu|cuda f32|bf16 [MAX_SHARD_BYTES]\n");
    return 2;
  }
  const std::string dir = argv[1], out = argv[2], device = argv[3], dtype = argv[4];
  const int64_t max_shard = argc == 6 ? std::stoll(argv[5]) : checkpoint::kDefaultMaxShardBytes;
  auto config = model::ReadHfConfig(dir);
  if (!config.ok()) return Fail(config.status());
  config->dtype = dtype == "bf16" ? DType::kBF16 : DType::kF32;
  std::unique_ptr<runtime::Backend> backend = runtime::MakeCpuBackend();
  if (device == "cuda") {
    auto gpu = runtime::MakeCudaBackend(0);
    if (!gpu.ok()) return Fail(gpu.status());
    backend = std::move(*gpu);
  }
  const std::vector<std::string> files = WeightFiles(dir);
  int64_t bytes = 0;
  for (const auto& f : files) bytes += Size(f);
  // 1. The disk.
  for (const auto& f : files) Evict(f);
  double resident = 0, disk_s = 0;
  for (const auto& f : files) resident += Resident(f) / static_cast<double>(files.size());
  for (const auto& f : files) disk_s += ReadAll(f);
  auto m = model::Llama::Create(*config, backend.get());
  if (!m.ok()) return Fail(m.status());
  // 2-3. Import, cold then warm.
  for (const auto& f : files) Evict(f);
  double cold_resident = 0;
  for (const auto& f : files) cold_resident += Resident(f) / static_cast<double>(files.size());
  auto t0 = std::chrono::steady_clock::now();
  if (auto st = checkpoint::ImportHf(dir, **m); !st.ok()) return Fail(st);
  if (auto st = backend->Synchronize(); !st.ok()) return Fail(st);
  const double cold_s = Since(t0);
  t0 = std::chrono::steady_clock::now();
  if (auto st = checkpoint::ImportHf(dir, **m); !st.ok()) return Fail(st);
  if (auto st = backend->Synchronize(); !st.ok()) return Fail(st);
  const double warm_s = Since(t0);
  // 4. Export (bf16, as published).
  t0 = std::chrono::steady_clock::now();
  if (auto st = checkpoint::ExportHf(out, **m, "BF16", true, nullptr, max_shard); !st.ok()) return Fail(st);
  const double export_s = Since(t0);
  const std::vector<std::string> written = WeightFiles(out);
  int64_t out_bytes = 0;
  for (const auto& f : written) out_bytes += Size(f);
  const nlohmann::json j = {{"dir", dir},
                            {"files", files.size()},
                            {"bytes", bytes},
                            {"resident_before_disk_read", resident},
                            {"disk_read_s", disk_s},
                            {"disk_read_gbps", bytes / disk_s / 1e9},
                            {"resident_before_cold_import", cold_resident},
                            {"import_cold_s", cold_s},
                            {"import_cold_gbps", bytes / cold_s / 1e9},
                            {"import_warm_s", warm_s},
                            {"import_warm_gbps", bytes / warm_s / 1e9},
                            {"export_files", written.size()},
                            {"export_bytes", out_bytes},
                            {"export_s", export_s},
                            {"export_gbps", out_bytes / export_s / 1e9}};
  printf("%s\n", j.dump().c_str());
  return 0;
}
