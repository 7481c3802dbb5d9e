// GPU tests (label gpu): NCCL communicators on 2 GPUs, bootstrapped through an
// in-memory store; skipped where fewer than 2 GPUs are visible.
#include <cuda.h>
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <thread>

#include "common/util.h"
#include "tests/common/mem_store.h"
#include "common/gpu_devices.h"
#include "worker/comm/nccl_communicator.h"

namespace tessera::comm {
namespace {

using ::testing::HasSubstr;

using ::tessera::testing::MemStore;

template <typename F>
void OnGpus(int64_t timeout_ms, F fn) {
  if (static_cast<int>(VisibleGpus().size()) < 2) GTEST_SKIP() << "needs 2 GPUs";
  MemStore store;
  std::string key = RandomHex(4);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      NcclOptions opts{r, timeout_ms};
      auto c = MakeNcclCommunicator("gpu/dp/0", key, r, 2, &store, opts);
      ASSERT_TRUE(c.ok()) << c.status();
      fn(r, **c);
    });
  for (auto& t : ts) t.join();
}

TEST(Nccl, AllReduceAndAllGatherAreExact) {
  OnGpus(60000, [](int r, Communicator& c) {
    const size_t n = (1 << 20) + 3;  // odd size
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = static_cast<float>((r * 7 + i) % 5);
    float *in, *out;
    ASSERT_EQ(cudaMalloc(&in, n * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&out, 2 * n * 4), cudaSuccess);
    cudaMemcpy(in, h.data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemset(out, 0xff, 2 * n * 4);
    ASSERT_TRUE(c.AllReduce(in, out, n, DType::kF32, ReduceOp::kSum).ok());
    ASSERT_TRUE(c.Synchronize().ok());
    std::vector<float> got(n);
    cudaMemcpy(got.data(), out, n * 4, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], (i % 5) + ((7 + i) % 5)) << i;
    ASSERT_TRUE(c.AllGather(in, out, n, DType::kF32).ok());
    ASSERT_TRUE(c.Synchronize().ok());
    std::vector<float> all(2 * n);
    cudaMemcpy(all.data(), out, 2 * n * 4, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(all[i], i % 5);
      ASSERT_EQ(all[n + i], (7 + i) % 5);
    }
    cudaFree(in);
    cudaFree(out);
  });
}

// Host values (the trainer's token counts, losses and token ids): exact, growing the
// staging buffers between calls, and not waiting for the compute stream it is ordered
// with — a kernel-free wait keeps that stream busy until a timer releases it, so a call
// that waits for compute shows as one that took the timer's 8 s (and the test ends).
TEST(Nccl, HostCollectivesAreExactAndDoNotWaitForCompute) {
  OnGpus(60000, [](int r, Communicator& c) {
    cudaStream_t compute;
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_TRUE(c.OrderWith(compute).ok());
    // Keep `compute` busy until released: a stream-ordered wait on mapped host memory.
    volatile uint32_t* flag = nullptr;
    ASSERT_EQ(cudaHostAlloc(const_cast<uint32_t**>(&flag), sizeof(uint32_t), cudaHostAllocMapped), cudaSuccess);
    *flag = 0;
    void* flag_dev = nullptr;
    ASSERT_EQ(cudaHostGetDevicePointer(&flag_dev, const_cast<uint32_t*>(flag), 0), cudaSuccess);
    // The driver's cuStreamWaitValue32 through the runtime (no link to libcuda, which
    // machines without a driver lack).
    using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &found), cudaSuccess);
    ASSERT_EQ(found, cudaDriverEntryPointSuccess);
    ASSERT_EQ(reinterpret_cast<WaitValue32>(fn)(compute, reinterpret_cast<CUdeviceptr>(flag_dev), 1, CU_STREAM_WAIT_VALUE_GEQ),
              CUDA_SUCCESS);
    std::thread release([flag] {
      std::this_thread::sleep_for(std::chrono::seconds(8));
      *flag = 1;
    });
    auto seconds = [t0 = std::chrono::steady_clock::now()]() mutable {
      auto t = std::chrono::steady_clock::now();
      double s = std::chrono::duration<double>(t - t0).count();
      t0 = t;
      return s;
    };
    int64_t tokens = 10 + r;
    ASSERT_TRUE(c.AllReduceHost(&tokens, &tokens, 1, DType::kI64, ReduceOp::kSum).ok());
    EXPECT_EQ(tokens, 21);
    EXPECT_LT(seconds(), 4.0) << "all_reduce_host waited for the compute stream";
    for (size_t n : {size_t{3}, size_t{5000}, size_t{300000}}) {  // the later ones grow the staging buffer
      std::vector<int32_t> mine(n), all(2 * n, -1);
      for (size_t i = 0; i < n; ++i) mine[i] = static_cast<int32_t>(r * 1000000 + i);
      ASSERT_TRUE(c.AllGatherHost(mine.data(), all.data(), n, DType::kI32).ok());
      EXPECT_LT(seconds(), 4.0) << "all_gather_host of " << n << " values waited for the compute stream";
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(all[i], static_cast<int32_t>(i));
        ASSERT_EQ(all[n + i], static_cast<int32_t>(1000000 + i));
      }
    }
    EXPECT_EQ(cudaStreamQuery(compute), cudaErrorNotReady) << "the compute stream was still busy throughout";
    release.join();
    ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
    cudaFreeHost(const_cast<uint32_t*>(flag));
    cudaStreamDestroy(compute);
  });
}

TEST(Nccl, WatchdogAbortsAStuckCollectiveNamingGroupCollectiveAndSequence) {
  OnGpus(3000, [](int r, Communicator& c) {
    float* buf;
    ASSERT_EQ(cudaMalloc(&buf, 1024 * 4), cudaSuccess);
    ASSERT_TRUE(c.AllReduce(buf, buf, 1024, DType::kF32, ReduceOp::kSum).ok());
    ASSERT_TRUE(c.Synchronize().ok());
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5000));  // never joins the second all-reduce
      c.Abort();
      return;
    }
    auto t0 = std::chrono::steady_clock::now();
    auto enq = c.AllReduce(buf, buf, 1024, DType::kF32, ReduceOp::kSum);
    auto st = enq.ok() ? c.Synchronize() : enq;
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("communicator 'gpu/dp/0' (nccl, rank 0 of 2)"));
    EXPECT_THAT(std::string(st.message()), HasSubstr("all_reduce #2 did not complete within 3000 ms"));
    EXPECT_LT(s, 4.5);
  });
}

}  // namespace
}  // namespace tessera::comm
