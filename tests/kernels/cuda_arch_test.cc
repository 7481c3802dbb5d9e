// Which GPUs a build's kernels run on (kernels/common/cuda_arch.h): CMake's architecture
// forms against compute capabilities, and the refusal's message.
#include "kernels/common/cuda_arch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera::kernels {
namespace {
using ::testing::HasSubstr;

bool Runs(const char* archs, int major, int minor) { return CheckComputeCapability(archs, 0, "GPU", major, minor).ok(); }

TEST(CudaArch, HopperSpecificKernelsRunOnHopperOnly) {
  EXPECT_TRUE(Runs("90a", 9, 0));
  EXPECT_FALSE(Runs("90a", 8, 0));   // A100
  EXPECT_FALSE(Runs("90a", 8, 9));   // L40S
  EXPECT_FALSE(Runs("90a", 10, 0));  // B200: arch-specific features do not carry forward
  EXPECT_FALSE(Runs("90a-virtual", 10, 0));
}

TEST(CudaArch, SassRunsWithinItsMajorAndPtxOnEveryLaterGpu) {
  EXPECT_TRUE(Runs("80-real", 8, 6));
  EXPECT_FALSE(Runs("86-real", 8, 0));
  EXPECT_FALSE(Runs("80-real", 9, 0));
  EXPECT_TRUE(Runs("80-virtual", 9, 0));
  EXPECT_TRUE(Runs("80", 12, 0));  // both: the PTX is compiled by the driver
  EXPECT_FALSE(Runs("80", 7, 5));
  EXPECT_TRUE(Runs("100f", 10, 3));
  EXPECT_FALSE(Runs("100f", 12, 0));
}

TEST(CudaArch, AnyListedArchitectureWillDo) {
  EXPECT_TRUE(Runs("80-real,90a-real", 8, 0));
  EXPECT_TRUE(Runs("80-real;90a-real", 9, 0));
  EXPECT_FALSE(Runs("80-real,90a-real", 10, 0));
}

TEST(CudaArch, TheRefusalNamesTheDeviceItsCapabilityAndTheBuild) {
  const absl::Status s = CheckComputeCapability("90a", 3, "NVIDIA A100-SXM4-80GB", 8, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("CUDA device 3 (NVIDIA A100-SXM4-80GB) is compute capability 8.0"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("kernels are for sm_90a"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("-DTESSERA_CUDA_ARCHITECTURES"));
}

TEST(CudaArch, HopperKernelsNeedA90GpuAndA90aPass) {
  EXPECT_TRUE(HopperKernels("80-real;90a-real", 9, 0));
  EXPECT_TRUE(HopperKernels("90a", 9, 0));
  EXPECT_TRUE(HopperKernels("90a-virtual", 9, 0));
  EXPECT_FALSE(HopperKernels("80-real;90a-real", 8, 0));   // Ampere: the portable kernels
  EXPECT_FALSE(HopperKernels("80-real;90a-real", 8, 9));   // Ada
  EXPECT_FALSE(HopperKernels("80-real;90a-real", 10, 0));  // Blackwell has none of 90a's
  EXPECT_FALSE(HopperKernels("80-virtual", 9, 0));         // a Hopper GPU, no 90a pass
  EXPECT_FALSE(HopperKernels("90-real", 9, 0));
  EXPECT_FALSE(HopperKernels("native", 9, 0));
}

TEST(CudaArch, AListItCannotReadRefusesNothing) {
  EXPECT_TRUE(Runs("", 8, 0));
  EXPECT_TRUE(Runs("native", 8, 0));
  EXPECT_TRUE(Runs("90a,all-major", 7, 0));
}

}  // namespace
}  // namespace tessera::kernels
