// GPU test (label gpu): the CUPTI trace (bench/cupti_trace.h) records a backend's kernel,
// copy and memset on the backend's stream inside the host range around them, in the CSV
// bench/nsys_gaps.py reads; a second trace in the process is refused. Skipped without a
// GPU (or without libcupti on the host: that skip says where it looked).
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/cupti_trace.h"
#include "common/gpu_devices.h"
#include "worker/runtime/backend.h"

namespace tessera::bench {
namespace {

struct Row {
  std::string kind;
  uint64_t start = 0, end = 0;
  uint32_t device = 0, stream = 0;
  std::string name;
};

// The trace's CSV: the name is the last field, quoted (quotes doubled inside).
std::vector<Row> ReadCsv(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "kind,start_ns,end_ns,device,stream,name");
  std::vector<Row> rows;
  while (std::getline(in, line)) {
    Row r;
    std::istringstream f(line);
    std::string field;
    std::getline(f, r.kind, ',');
    std::getline(f, field, ','), r.start = std::stoull(field);
    std::getline(f, field, ','), r.end = std::stoull(field);
    std::getline(f, field, ','), r.device = static_cast<uint32_t>(std::stoul(field));
    std::getline(f, field, ','), r.stream = static_cast<uint32_t>(std::stoul(field));
    std::getline(f, r.name);
    EXPECT_TRUE(r.name.size() >= 2 && r.name.front() == '"' && r.name.back() == '"') << line;
    r.name = r.name.substr(1, r.name.size() - 2);
    rows.push_back(r);
  }
  return rows;
}

TEST(CuptiTrace, RecordsTheBackendsWorkInsideItsRange) {
  if (static_cast<int>(VisibleGpus().size()) < 1) GTEST_SKIP() << "needs a GPU";
  auto trace = CuptiTrace::Start();  // before this process's first CUDA work
  if (!trace.ok() && trace.status().code() == absl::StatusCode::kUnavailable) GTEST_SKIP() << trace.status();
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(CuptiTrace::Start().status().code(), absl::StatusCode::kFailedPrecondition);

  auto be = runtime::MakeCudaBackend(0);
  ASSERT_TRUE(be.ok()) << be.status();
  const uint64_t begin = (*trace)->Now();
  auto x = (*be)->Empty({1 << 20}, tessera::DType::kF32);
  auto t = (*be)->Empty({1 << 20}, tessera::DType::kF32);
  ASSERT_TRUE(x.ok() && t.ok());
  ASSERT_TRUE((*be)->Fill(*x, 0x40).ok());  // a memset: every float 0x40404040
  ASSERT_TRUE((*be)->Axpby(2.f, *x, 0.f, *t).ok());  // a kernel on the backend's stream
  std::vector<float> host(1 << 20);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), t->data(), host.size() * 4, cudaMemcpyDeviceToHost,
                            static_cast<cudaStream_t>((*be)->stream())),
            cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(t->data(), 0, 4096, static_cast<cudaStream_t>((*be)->stream())), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>((*be)->stream())), cudaSuccess);
  uint32_t bits = 0x40404040;
  float filled;
  std::memcpy(&filled, &bits, 4);
  EXPECT_EQ(host[12345], 2.f * filled);
  const uint64_t end = (*trace)->Now();
  (*trace)->Range("timed \"step\", quoted", begin, end);

  const std::string path = ::testing::TempDir() + "/cupti_trace_test.csv";
  std::string summary;
  ASSERT_TRUE((*trace)->Write(path, &summary).ok());
  const std::vector<Row> rows = ReadCsv(path);
  int kernels = 0, copies = 0, memsets = 0, ranges = 0;
  uint32_t kernel_stream = 0;
  for (const Row& r : rows) {
    if (r.kind == "range") {
      ++ranges;
      EXPECT_EQ(r.name, "timed \"\"step\"\", quoted");  // CSV: inner quotes doubled
      EXPECT_EQ(r.start, begin);
      continue;
    }
    if (r.start < begin || r.end > end) continue;  // the backend's set-up work
    EXPECT_LE(r.start, r.end) << r.name;
    EXPECT_EQ(r.device, 0u) << r.name;
    if (r.kind == "kernel") ++kernels, kernel_stream = r.stream;
    if (r.kind == "memcpy") {
      ++copies;
      EXPECT_EQ(r.name, "memcpy DtoH 4194304 B");
    }
    if (r.kind == "memset") {
      ++memsets;
      EXPECT_TRUE(r.name == "memset 4194304 B" || r.name == "memset 4096 B") << r.name;
    }
  }
  EXPECT_EQ(ranges, 1);
  EXPECT_GE(kernels, 1) << summary;
  EXPECT_EQ(copies, 1) << summary;
  EXPECT_EQ(memsets, 2) << summary;
  for (const Row& r : rows) {  // the copy and memset went to the kernel's stream
    if ((r.kind == "memcpy" || r.kind == "memset") && r.start >= begin) {
      EXPECT_EQ(r.stream, kernel_stream) << r.name;
    }
  }
}

}  // namespace
}  // namespace tessera::bench
