// MFU's denominator: the table's rows for the names CUDA reports, and 0 (no MFU) for
// unknown devices, CPUs and dtypes without a figure.
#include "worker/runtime/device_peak.h"

#include "gtest/gtest.h"

namespace tessera::runtime {
namespace {

TEST(PeakFlops, KnownCardsUnknownZero) {
  EXPECT_DOUBLE_EQ(PeakFlops("NVIDIA H100 80GB HBM3", DType::kBF16), 989e12);
  EXPECT_DOUBLE_EQ(PeakFlops("NVIDIA H100 80GB HBM3", DType::kF32), 67e12);
  EXPECT_DOUBLE_EQ(PeakFlops("NVIDIA H200", DType::kBF16), 989e12);
  EXPECT_DOUBLE_EQ(PeakFlops("NVIDIA H100 PCIe", DType::kBF16), 756e12);
  EXPECT_DOUBLE_EQ(PeakFlops("NVIDIA A100-SXM4-80GB", DType::kBF16), 312e12);
  EXPECT_EQ(PeakFlops("cpu", DType::kF32), 0);
  EXPECT_EQ(PeakFlops("NVIDIA GeForce RTX 4090", DType::kBF16), 0);
  EXPECT_EQ(PeakFlops("NVIDIA H100 80GB HBM3", DType::kI32), 0);
}

}  // namespace
}  // namespace tessera::runtime
