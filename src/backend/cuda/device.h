// CUDA devices visible to this process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  uint64_t total_bytes = 0;  // device memory
  uint64_t free_bytes = 0;   // cudaMemGetInfo at query time
  int cc_major = 0;          // compute capability
  int cc_minor = 0;
  int sm_count = 0;
};

// Every visible device; empty when there is no driver or no device (not an error).
// Other CUDA failures throw Error(kIo).
std::vector<DeviceInfo> list_devices();

// Runs a trivial kernel on `device` and checks its result: proves the build's architectures
// match the device. Throws Error on failure.
void smoke_test(int device);

}  // namespace kvtier::cuda
