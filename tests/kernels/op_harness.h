// The op harness shared by tests/kernels/*_test.cc: one parameterized fixture over the
// backends (`cpu`, `cuda`; CUDA skips without a device), fresh random inputs (a new seed
// per test, printed on failure), poisoned outputs, relative-error measures. The
// tolerances and their reasons are listed in op_test.cc.
#pragma once
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "worker/runtime/backend.h"

namespace tessera::runtime::test {

using ::testing::HasSubstr;

struct Rng {
  explicit Rng(uint64_t seed) : gen(seed) {}
  std::vector<float> Normal(size_t n, float scale = 1.f) {
    std::normal_distribution<float> d(0.f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(gen);
    return v;
  }
  std::mt19937_64 gen;
};

// A fresh seed per test, printed in each check's trace; TESSERA_TEST_SEED=<seed> replays
// a failure (the first test takes that seed).
inline uint64_t Seed() {
  static uint64_t s = [] {
    if (const char* fixed = std::getenv("TESSERA_TEST_SEED")) return uint64_t(std::strtoull(fixed, nullptr, 10));
    return uint64_t(std::random_device{}()) ^ (uint64_t(std::random_device{}()) << 32);
  }();
  return s++;
}

// Rounds values through the dtype so that every backend and reference sees the same inputs.
inline std::vector<float> Quantize(std::vector<float> v, DType t) {
  if (t == DType::kBF16) for (auto& x : v) x = Bf16ToFloat(FloatToBf16(x));
  return v;
}

inline Tensor Make(Backend& b, std::vector<int64_t> shape, DType t, const std::vector<float>& vals) {
  auto ten = b.Empty(shape, t);
  EXPECT_TRUE(ten.ok()) << ten.status();
  std::vector<char> bytes(vals.size() * DTypeSize(t));
  for (size_t i = 0; i < vals.size(); ++i) {
    if (t == DType::kF32) std::memcpy(&bytes[i * 4], &vals[i], 4);
    else {
      const uint16_t h = t == DType::kF16 ? FloatToF16(vals[i]) : FloatToBf16(vals[i]);
      std::memcpy(&bytes[i * 2], &h, 2);
    }
  }
  EXPECT_TRUE(b.CopyFromHost(bytes.data(), *ten).ok());
  return *ten;
}

inline Tensor Ints(Backend& b, const std::vector<int32_t>& v) {
  auto t = b.Empty({static_cast<int64_t>(v.size())}, DType::kI32);
  EXPECT_TRUE(t.ok());
  EXPECT_TRUE(b.CopyFromHost(v.data(), *t).ok());
  return *t;
}

inline Tensor Out(Backend& b, std::vector<int64_t> shape, DType t) {
  auto ten = b.Empty(shape, t);
  EXPECT_TRUE(ten.ok());
  EXPECT_TRUE(b.Fill(*ten, 0xff).ok());  // poison
  return *ten;
}

inline std::vector<float> Read(Backend& b, const Tensor& t) {
  std::vector<char> bytes(t.nbytes());
  EXPECT_TRUE(b.CopyToHost(t, bytes.data()).ok());
  std::vector<float> v(t.numel());
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype() == DType::kF32) std::memcpy(&v[i], &bytes[i * 4], 4);
    else {
      uint16_t h;
      std::memcpy(&h, &bytes[i * 2], 2);
      v[i] = t.dtype() == DType::kF16 ? F16ToFloat(h) : Bf16ToFloat(h);
    }
  }
  return v;
}

inline double RelErr(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;  // NaN from poison or overflow never passes
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}
inline double RelErr(const std::vector<float>& got, const std::vector<float>& ref) {
  return RelErr(got, std::vector<double>(ref.begin(), ref.end()));
}

// ||got - ref|| / ||scale||: for results that cancel, relative to the size of the terms.
inline double ErrOverScale(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<float>& scale) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += double(got[i] - ref[i]) * (got[i] - ref[i]);
    den += double(scale[i]) * scale[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

class OpTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto b = MakeBackend(GetParam() == "cpu" ? Device::Cpu() : Device::Cuda(0));
    if (!b.ok()) GTEST_SKIP() << GetParam() << ": " << b.status();
    be_ = std::move(*b);
    // The attention tests check our flash kernels, so the forward's cuDNN path (auto for
    // sequences of one length) is off here; CudnnAttentionForwardMatchesReference
    // checks it and the auto dispatch.
    be_->set_attention_engine(kernels::AttentionEngine::kFlash);
    ref_ = MakeCpuBackend();
    seed_ = Seed();
  }
  bool cpu() const { return GetParam() == "cpu"; }
  double Tol(DType t) const { return t == DType::kBF16 ? 2e-2 : (cpu() ? 1e-6 : 1e-5); }
  std::unique_ptr<Backend> be_, ref_;
  uint64_t seed_ = 0;
};

}  // namespace tessera::runtime::test
