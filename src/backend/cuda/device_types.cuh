// Device-side loads and stores of the KvDtype element types as f32 (CUDA translation units only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/dtype.h"

namespace kvtier::cuda {

__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(__half x) {
  return __half2float(x);
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// bf16 bits (as stored by the host side, uint16_t) to f32: exact.
__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

// Calls f.template operator()<T>() with the element type of `t`.
template <typename F>
void dispatch_kv_dtype(KvDtype t, F&& f) {
  switch (t) {
    case KvDtype::kF32:
      f(float{});
      return;
    case KvDtype::kF16:
      f(__half{});
      return;
    case KvDtype::kBF16:
      f(__nv_bfloat16{});
      return;
  }
}

// Grid size for n elements handled `per_block` at a time, capped to keep grid-stride loops.
inline unsigned grid_for(int64_t n, int64_t per_block) {
  int64_t g = (n + per_block - 1) / per_block;
  if (g < 1) g = 1;
  if (g > 65535LL * 16) g = 65535LL * 16;
  return static_cast<unsigned>(g);
}

}  // namespace kvtier::cuda
