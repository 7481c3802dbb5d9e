// The safetensors reader (worker/checkpoint/safetensors.h) on arbitrary files: a corrupt
// or truncated header or data section is refused with a status — never an
// out-of-bounds read. Every tensor the reader accepts is read whole.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "worker/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/tessera-fuzz-" + std::to_string(getpid()) + ".safetensors";
  FILE* f = fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  fwrite(data, 1, size, f);
  fclose(f);
  auto r = tessera::checkpoint::SafetensorsReader::Open(path);
  if (r.ok())
    for (const auto& [name, info] : (*r)->tensors()) (void)(*r)->ReadF32(name);
  return 0;
}
