// GGUF weights to the device as bf16: each row is dequantised on the host by the CPU backend's
// reference dequantiser (backend/cpu/dequant.h, bit-identical to the gguf package), rounded to bf16
// (nearest even) and uploaded through a pinned staging buffer. Exact with respect to the CPU
// dequantisation followed by one bf16 rounding; quantised GPU GEMMs may replace this later.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/ggml_type.h"

namespace kvtier::cuda {

class PinnedHostPool;

// Host part: src [n] elements of `type` (n a multiple of its block size) -> dst [n] bf16 bits.
// `tmp`: [>= row elements] f32 scratch; rows of `row_len` elements are dequantised one at a time.
void dequantize_to_bf16(GgmlType type, const uint8_t* src, int64_t n_rows, int64_t row_len,
                        std::span<float> tmp, uint16_t* dst);

// Uploads a [n_rows, row_len] weight of `type` to dst ([n_rows, row_len] bf16 bits, device) in
// pieces of at most `staging_bytes` through pinned memory from `pool` (allocated once per call
// and released on return). Blocks until the copy is done (load time, not a hot path).
void upload_weight_bf16(GgmlType type, const uint8_t* src, int64_t n_rows, int64_t row_len, uint16_t* dst,
                        PinnedHostPool& pool, size_t staging_bytes, cudaStream_t stream);

}  // namespace kvtier::cuda
