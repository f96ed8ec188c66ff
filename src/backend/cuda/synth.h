// Synthetic-model weights generated on the device: the values of model/synthetic.h (a pure function
// of seed, tensor name and element index), so an 8B-scale model needs neither a file nor a host
// copy. Element i of tensor `name` is
//   r = mix64(key + i * 0x9e3779b97f4a7c15), key = mix64(seed ^ fnv1a(name)),
//   u = (r >> 40) / 2^24,  value = (2u - 1) * a,  a = scale * sqrt(3)   (uniform, sd = scale)
// with every f32 operation exact but the last product: bit-identical to synth_values on the CPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string_view>

namespace kvtier::cuda {

// The per-tensor key of model/synthetic.cpp.
uint64_t synth_key(uint64_t seed, std::string_view tensor_name);

// dst[j] = value of element first + j, j < n: as f32, or rounded to bf16 (nearest even).
// `scale` is the tensor's standard deviation (SynthTensor::scale).
void synth_uniform_f32(uint64_t key, float scale, uint64_t first, int64_t n, float* dst, cudaStream_t stream);
void synth_uniform_bf16(uint64_t key, float scale, uint64_t first, int64_t n, uint16_t* dst,
                        cudaStream_t stream);

// dst[j] = value (norm weights: SynthInit::kOnes).
void fill_f32(float value, int64_t n, float* dst, cudaStream_t stream);

}  // namespace kvtier::cuda
