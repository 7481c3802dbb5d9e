// Event-timed loop shared by the variant sweeps: 5 warm-up calls, then the mean of
// `iters` calls in milliseconds, all on the default stream.
#pragma once
#include <cuda_runtime.h>

template <typename F>
float TimeMs(F f, int iters = 50) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 5; ++i) f();
  cudaEventRecord(a);
  for (int i = 0; i < iters; ++i) f();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}
