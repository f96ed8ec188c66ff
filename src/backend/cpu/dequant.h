// Scalar reference dequantisation of GGML weight rows to f32. The float operations (and their order)
// are those of the GGML format definitions, so results are bit-identical to the `gguf` Python
// package's numpy dequantisation (tested on every tensor of the project's real models).
#pragma once

#include <cstdint>

#include "core/ggml_type.h"

namespace kvtier::cpu {

// Types these CPU kernels compute (dequantise, dot, matmul): f32, f16, bf16, q4_0, q4_1, q5_0,
// q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K.
bool is_supported_weight_type(GgmlType type);

// src: [n] elements of `type` (n a multiple of its block size) -> dst: [n] f32.
// Throws Error(kUnsupported) for a type outside is_supported_weight_type.
void dequantize_row(GgmlType type, const uint8_t* src, float* dst, int64_t n);

}  // namespace kvtier::cpu
