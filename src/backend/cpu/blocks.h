// Byte layouts of the GGML weight blocks and of the quantised activation rows the dot products use.
// Plain structs only (no functions): this header is included by the per-ISA translation units, which
// must not emit shared inline code compiled for a wider ISA.
//
// f16 fields are stored as raw uint16_t bits. Little-endian throughout.
#pragma once

#include <cstdint>

namespace kvtier::cpu {

constexpr int kQK = 32;    // elements per legacy block
constexpr int kQKK = 256;  // elements per K-quant super-block

// x[i] = d * (q[i] - 8); q[i] = qs[i] & 15 for i < 16, qs[i - 16] >> 4 otherwise.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
// x[i] = d * q[i] + m
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
// Fifth bit of element i is bit i of qh (little-endian u32); x[i] = d * (q[i] - 16).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
// x[i] = d * q[i] + m
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
// x[i] = d * qs[i]
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};

// 16 sub-blocks of 16; scales[j]: low nibble scale, high nibble min. 2-bit quants.
struct BlockQ2_K {
  uint8_t scales[kQKK / 16];
  uint8_t qs[kQKK / 4];
  uint16_t d;
  uint16_t dmin;
};
// 16 sub-blocks of 16, 6-bit signed scales (offset 32) packed in 12 bytes; 3-bit quants with the
// high bit in hmask (bit clear means subtract 4).
struct BlockQ3_K {
  uint8_t hmask[kQKK / 8];
  uint8_t qs[kQKK / 4];
  uint8_t scales[12];
  uint16_t d;
};
// 8 sub-blocks of 32, 6-bit scales and mins packed in 12 bytes; 4-bit quants.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQKK / 2];
};
// As Q4_K plus a fifth bit per element in qh.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
// 16 sub-blocks of 16 with int8 scales; 6-bit quants (low 4 bits in ql, high 2 in qh), offset 32.
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

// Quantised activations for the legacy (32-element) weight types: a[i] ~= d * qs[i], qs in
// [-127, 127]. The second field, by ActFormat (quantize_act.h), lets a block's offset or min term be
// applied once: kQ8_32 (q4_0, q5_0, q8_0) keeps the integer sum of qs; kQ8_32Min (q4_1, q5_1) keeps
// dsum = d * f32(sum of qs), rounded once, so the min term is one FMA: m = fma(f32(m_w), dsum, m).
struct ActQ8_32 {
  float d;
  union {
    int32_t sum;  // kQ8_32
    float dsum;   // kQ8_32Min
  };
  int8_t qs[kQK];
};
// Sets blk's second field from the sum of its quants, blk.d already set: kMin for kQ8_32Min.
template <bool kMin>
inline void set_act_sum(ActQ8_32& blk, int32_t sum) {
  if constexpr (kMin)
    blk.dsum = blk.d * static_cast<float>(sum);
  else
    blk.sum = sum;
}
// Quantised activations for the K-quants: bsums[j] = sum of qs[16 j .. 16 j + 15].
struct ActQ8_K {
  float d;
  int16_t bsums[kQKK / 16];
  int8_t qs[kQKK];
};

static_assert(sizeof(ActQ8_32) == 40 && sizeof(ActQ8_K) == 292);

}  // namespace kvtier::cpu
