#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"

namespace kvtier::cuda {
namespace {

__global__ void iota_kernel(int* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 3 * i + 1;
}

}  // namespace

std::vector<DeviceInfo> list_devices() {
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  if (st == cudaErrorNoDevice || st == cudaErrorInsufficientDriver) {
    cudaGetLastError();  // clear the sticky error state
    return {};
  }
  check(st, "cudaGetDeviceCount", __FILE__, __LINE__);
  std::vector<DeviceInfo> out;
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp p{};
    KVTIER_CUDA_CHECK(cudaGetDeviceProperties(&p, d));
    DeviceInfo info;
    info.index = d;
    info.name = p.name;
    info.total_bytes = p.totalGlobalMem;
    info.cc_major = p.major;
    info.cc_minor = p.minor;
    info.sm_count = p.multiProcessorCount;
    size_t free_b = 0, total_b = 0;
    KVTIER_CUDA_CHECK(cudaSetDevice(d));
    KVTIER_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    info.free_bytes = free_b;
    out.push_back(info);
  }
  return out;
}

void smoke_test(int device) {
  constexpr int n = 1000;
  KVTIER_CUDA_CHECK(cudaSetDevice(device));
  int* d_out = nullptr;
  KVTIER_CUDA_CHECK(cudaMalloc(&d_out, n * sizeof(int)));
  iota_kernel<<<(n + 255) / 256, 256>>>(d_out, n);
  const cudaError_t launch = cudaGetLastError();
  std::vector<int> h(n, 0);
  const cudaError_t copy = cudaMemcpy(h.data(), d_out, n * sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d_out);
  check(launch, "iota_kernel launch", __FILE__, __LINE__);
  check(copy, "cudaMemcpy", __FILE__, __LINE__);
  for (int i = 0; i < n; ++i) {
    if (h[i] != 3 * i + 1) {
      fail(ErrorKind::kInternal, "CUDA smoke test: element {} is {}, expected {}", i, h[i], 3 * i + 1);
    }
  }
}

}  // namespace kvtier::cuda
