#include "worker/runtime/device_peak.h"

namespace tessera::runtime {

double PeakFlops(const std::string& name, DType dtype) {
  struct Row {
    const char* match;  // a substring of the name; the first matching row wins
    const char* also;   // and this one too (nullptr: none)
    double bf16, f32;   // TFLOP/s, dense
  };
  static const Row kTable[] = {
      {"H200", nullptr, 989, 67},     {"H100", "PCIe", 756, 51},  {"H100", "NVL", 835, 60},
      {"H100", nullptr, 989, 67},     {"H800", nullptr, 989, 67}, {"A100", nullptr, 312, 19.5},
      {"L40S", nullptr, 362, 91.6},
  };
  if (dtype != DType::kBF16 && dtype != DType::kF32) return 0;
  for (const Row& r : kTable)
    if (name.find(r.match) != std::string::npos && (r.also == nullptr || name.find(r.also) != std::string::npos))
      return 1e12 * (dtype == DType::kBF16 ? r.bf16 : r.f32);
  return 0;
}

}  // namespace tessera::runtime
