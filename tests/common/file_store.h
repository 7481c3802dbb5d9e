// A KvStore in a directory, shared by processes of one host (benchmarks and tests that
// run a rank per process, as executors do; the rendezvous is what production uses).
// Set writes the value to a temporary file and renames it over the key's file (readers
// see all of a value or none); Get polls for the file every millisecond.
// Threading: any thread, any process; no state besides the directory.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "worker/comm/rendezvous_client.h"

namespace tessera::testing {

class FileStore : public comm::KvStore {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}
  absl::Status Set(const std::string& k, const std::string& v) override {
    const std::string path = Path(k), tmp = absl::StrCat(path, ".tmp.", getpid());
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f.write(v.data(), static_cast<std::streamsize>(v.size()));
      if (!f) return absl::UnavailableError(absl::StrCat("file store: cannot write ", tmp));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      return absl::UnavailableError(absl::StrCat("file store: cannot rename ", tmp, " to ", path));
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& k, int64_t timeout_ms) override {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    const std::string path = Path(k);
    do {
      std::ifstream f(path, std::ios::binary);
      if (f) {
        std::ostringstream s;
        s << f.rdbuf();
        return s.str();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } while (std::chrono::steady_clock::now() < end);
    return absl::DeadlineExceededError(absl::StrCat("file store: no key ", k, " within ", timeout_ms, " ms"));
  }

 private:
  // Keys may hold '/' and other characters: the file name is the key in hex.
  std::string Path(const std::string& k) const {
    static const char* hex = "0123456789abcdef";
    std::string name;
    for (unsigned char c : k) name += hex[c >> 4], name += hex[c & 15];
    return absl::StrCat(dir_, "/", name);
  }
  std::string dir_;
};

}  // namespace tessera::testing
