// GPU tests: they run on a machine with an NVIDIA GPU and skip loudly elsewhere.
#include <gtest/gtest.h>

#include <cstdio>

#include "backend/cuda/device.h"

namespace kvtier::cuda {
namespace {

TEST(CudaDevice, ListsDevicesAndRunsAKernel) {
  const auto devices = list_devices();
  if (devices.empty()) {
    std::fprintf(stderr, "*** SKIPPED: no CUDA device on this machine; GPU tests did not run ***\n");
    GTEST_SKIP() << "no CUDA device";
  }
  for (const auto& d : devices) {
    std::fprintf(stderr, "device %d: %s, %.1f GiB (%.1f free), sm_%d%d, %d SMs\n", d.index, d.name.c_str(),
                 d.total_bytes / 1073741824.0, d.free_bytes / 1073741824.0, d.cc_major, d.cc_minor,
                 d.sm_count);
    EXPECT_GT(d.total_bytes, 0u);
    EXPECT_NO_THROW(smoke_test(d.index));
  }
}

}  // namespace
}  // namespace kvtier::cuda
