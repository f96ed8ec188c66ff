// Quantisation of f32 activations for the integer dot products: each weight type is paired with
// one activation format (ActFormat). Activation rows are quantised once per matmul call and reused
// by every weight row. quantize_act_row is the scalar reference; the kernel tables' SIMD versions
// (KernelTable::quantize_act) write the very same bytes (a test holds them to it), so SIMD and
// reference dot products see the very same quantised input.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/ggml_type.h"

namespace kvtier::cpu {

enum class ActFormat {
  kF32,       // float weights (f32, f16, bf16): activations stay f32
  kQ8_32,     // q4_0, q5_0, q8_0: ActQ8_32 blocks of 32 with the sum of their quants
  kQ8_32Min,  // q4_1, q5_1: ActQ8_32 blocks of 32 with d * that sum as a float (blocks.h)
  kQ8_K,      // K-quants: ActQ8_K blocks of 256
};

ActFormat act_format_for(GgmlType weight_type);
int act_block_size(ActFormat format);  // elements per activation block (1 for kF32)
// Bytes of one quantised activation row of k elements (k a multiple of act_block_size).
size_t act_row_bytes(ActFormat format, int64_t k);

// x: [k] f32 -> dst: act_row_bytes(format, k) bytes. Per block: d = max|x| / 127, q = round-to-
// nearest-even(x / d) in [-127, 127] (d = 0 gives q = 0), plus the block's (or 16-group's) sums of q
// (kQ8_32Min: d * f32(the block's sum)).
void quantize_act_row(ActFormat format, const float* x, int64_t k, uint8_t* dst);

}  // namespace kvtier::cpu
