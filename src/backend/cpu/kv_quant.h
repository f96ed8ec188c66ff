// KIVI-style KV quantisation (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV
// Cache", 2024): asymmetric (min, scale) per group at 4 or 2 bits,
//   keys per channel over a group of `key_group` consecutive tokens (a channel's outliers stay in
//   its own range), values per token over groups of `value_group` channels.
// A quantised block holds `block_tokens` tokens of one head's K or V plane (d = head dimension):
//   K: data [block_tokens, d] packed, scale [block_tokens / key_group, d] f16, min [same] f16
//   V: data [block_tokens, d] packed, scale [block_tokens, d / value_group] f16, min [same] f16
// Element (t, i) of the data is bits [i * bits, (i + 1) * bits) of row t (rows of d * bits / 8 bytes,
// low bits first). A value dequantises to q * scale + min as one fused multiply-add, so every ISA
// gets the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/cpu_features.h"

namespace kvtier::cpu {

enum class KiviPlane { kKey, kValue };

struct KiviFormat {
  int bits = 0;              // 4 or 2; 0: not quantised
  int64_t block_tokens = 0;  // tokens per block (a multiple of key_group)
  int64_t key_group = 32;    // tokens per key group
  int64_t value_group = 32;  // channels per value group (kivi_format: 32 when it divides d, else d)
  bool operator==(const KiviFormat&) const = default;
};

// The format for the given knobs; throws Error(kInvalidArgument) naming what cannot work (bits not 4
// or 2, a key group that does not divide the block, a head dimension that is not a multiple of 16).
KiviFormat kivi_format(int bits, int64_t block_tokens, int64_t key_group, int64_t head_dim_k,
                       int64_t head_dim_v);

// Bytes of one block of one head's plane (d: that plane's head dimension).
uint64_t kivi_block_bytes(const KiviFormat& f, KiviPlane p, int64_t d);

// Quantises key group `group` of a block (tokens [group * key_group, (group + 1) * key_group)) from
// f16 rows: src row j (j < key_group) at src + j * src_stride elements, d of them.
void kivi_quantize_keys(const KiviFormat& f, int64_t d, const uint16_t* src, int64_t src_stride,
                        int64_t group, uint8_t* block);
// Quantises the values of block tokens [t0, t0 + n) from f16 rows (row j at src + j * src_stride).
void kivi_quantize_values(const KiviFormat& f, int64_t d, const uint16_t* src, int64_t src_stride, int64_t t0,
                          int64_t n, uint8_t* block);

// Rows [t0, t0 + n) of a block as f32: dst [n, d] f32.
using KiviDequantFn = void (*)(const KiviFormat& f, KiviPlane p, int64_t d, const uint8_t* block, int64_t t0,
                               int64_t n, float* dst);
void kivi_dequant_ref(const KiviFormat& f, KiviPlane p, int64_t d, const uint8_t* block, int64_t t0,
                      int64_t n, float* dst);
void kivi_dequant_avx2(const KiviFormat& f, KiviPlane p, int64_t d, const uint8_t* block, int64_t t0,
                       int64_t n, float* dst);
void kivi_dequant_avx512(const KiviFormat& f, KiviPlane p, int64_t d, const uint8_t* block, int64_t t0,
                         int64_t n, float* dst);
KiviDequantFn kivi_dequant_fn(Isa isa);

// Where the parts of a block are (shared by the kernels).
struct KiviBlockParts {
  uint64_t row_bytes;    // packed bytes of one token's row
  uint64_t data_bytes;   // [block_tokens] rows
  uint64_t param_count;  // scales (= mins) in the block
  int64_t param_row;     // params per parameter row (K: d per group; V: d / value_group per token)
};
KiviBlockParts kivi_block_parts(const KiviFormat& f, KiviPlane p, int64_t d);

}  // namespace kvtier::cpu
