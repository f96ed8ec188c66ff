// Helpers of the GPU tests: a loud skip where there is no device, device buffers for test data,
// and the normalised mean squared error used for tolerances.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"

namespace kvtier::cuda::test {

inline bool have_gpu() {
  return !list_devices().empty();
}

// Skips the test with a visible message when no CUDA device is present.
#define KVTIER_REQUIRE_GPU()                                                                             \
  do {                                                                                                   \
    if (!::kvtier::cuda::test::have_gpu()) {                                                             \
      std::fprintf(stderr, "*** SKIPPED: no CUDA device on this machine; GPU test %s did not run ***\n", \
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());                     \
      GTEST_SKIP() << "no CUDA device";                                                                  \
    }                                                                                                    \
  } while (0)

// Device memory owned by a test (tests may allocate freely; the engine uses the arena).
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_ > 0) KVTIER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    KVTIER_CUDA_CHECK(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    KVTIER_CUDA_CHECK(cudaDeviceSynchronize());
    if (n_ > 0) KVTIER_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void fill_bytes(int byte) { KVTIER_CUDA_CHECK(cudaMemset(p_, byte, n_ * sizeof(T))); }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// sum (a - ref)^2 / sum ref^2 (0 when both are all zero). Non-finite values count as infinite error.
inline double nmse(const std::vector<float>& a, const std::vector<float>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(ref[i]);
    num += d * d;
    den += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  if (!(num == num) || num == INFINITY) return INFINITY;
  return den == 0.0 ? num : num / den;
}

inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Bitwise equality of float vectors (NaN-safe, -0 != +0).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace kvtier::cuda::test
