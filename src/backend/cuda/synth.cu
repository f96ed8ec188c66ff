// Synthetic weights on the device (synth.h).
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_types.cuh"
#include "backend/cuda/synth.h"

namespace kvtier::cuda {
namespace {

constexpr int kThreads = 256;

__host__ __device__ inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

__device__ __forceinline__ float synth_value(uint64_t key, float a, uint64_t i) {
  const uint64_t r = mix64(key + i * 0x9e3779b97f4a7c15ULL);
  const float u = __fmul_rn(static_cast<float>(r >> 40), 1.0f / 16777216.0f);
  return __fmul_rn(__fsub_rn(__fmul_rn(2.0f, u), 1.0f), a);
}

template <bool kBf16>
__global__ void synth_kernel(uint64_t key, float a, uint64_t first, int64_t n, void* dst) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n;
       j += int64_t{gridDim.x} * blockDim.x) {
    const float v = synth_value(key, a, first + static_cast<uint64_t>(j));
    if constexpr (kBf16) {
      static_cast<uint16_t*>(dst)[j] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    } else {
      static_cast<float*>(dst)[j] = v;
    }
  }
}

__global__ void fill_kernel(float value, int64_t n, float* dst) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n;
       j += int64_t{gridDim.x} * blockDim.x) {
    dst[j] = value;
  }
}

// a = scale * sqrt(3) in f32, as the CPU computes it.
float amplitude(float scale) {
  return scale * std::sqrt(3.0f);
}

}  // namespace

uint64_t synth_key(uint64_t seed, std::string_view tensor_name) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : tensor_name) h = (h ^ c) * 0x100000001b3ULL;
  return mix64(seed ^ h);
}

void synth_uniform_f32(uint64_t key, float scale, uint64_t first, int64_t n, float* dst,
                       cudaStream_t stream) {
  if (n <= 0) return;
  synth_kernel<false><<<grid_for(n, kThreads), kThreads, 0, stream>>>(key, amplitude(scale), first, n, dst);
  KVTIER_CUDA_CHECK_LAUNCH("synth_kernel");
}

void synth_uniform_bf16(uint64_t key, float scale, uint64_t first, int64_t n, uint16_t* dst,
                        cudaStream_t stream) {
  if (n <= 0) return;
  synth_kernel<true><<<grid_for(n, kThreads), kThreads, 0, stream>>>(key, amplitude(scale), first, n, dst);
  KVTIER_CUDA_CHECK_LAUNCH("synth_kernel");
}

void fill_f32(float value, int64_t n, float* dst, cudaStream_t stream) {
  if (n <= 0) return;
  fill_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(value, n, dst);
  KVTIER_CUDA_CHECK_LAUNCH("fill_kernel");
}

}  // namespace kvtier::cuda
