// Small scalar helpers to unpack block fields, shared by the reference kernels and the SIMD ones.
// Every function has internal linkage (static): a copy compiled with AVX-512 flags must never be
// merged with, and then called by, code that runs on a CPU without AVX-512.
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/cpu/blocks.h"

namespace kvtier::cpu {

// IEEE half to float without F16C (same bit-exact conversion as core/half.h).
static inline float unpack_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    uint32_t e = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

static inline float unpack_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Q4_K / Q5_K: scale and min (6 bits each) of sub-block j in [0, 8) from the 12 packed bytes:
// bytes 0..3 hold scales 0..3 (low 6 bits), bytes 4..7 mins 0..3; scales/mins 4..7 take their low
// 4 bits from bytes 8..11 and their high 2 bits from the top bits of bytes 0..3 / 4..7.
static inline void unpack_scale_min_k4(const uint8_t* s, int j, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// All 8 scales and mins of unpack_scale_min_k4 at once, with 32-bit word operations.
static inline void unpack_scales_mins_k4(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  uint32_t u[3];
  std::memcpy(u, s, 12);
  const uint32_t m6 = 0x3f3f3f3fu, m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
  const uint32_t sc_lo = u[0] & m6, mn_lo = u[1] & m6;
  const uint32_t sc_hi = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);
  const uint32_t mn_hi = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);
  std::memcpy(sc, &sc_lo, 4);
  std::memcpy(sc + 4, &sc_hi, 4);
  std::memcpy(mn, &mn_lo, 4);
  std::memcpy(mn + 4, &mn_hi, 4);
}

// Q3_K: the 16 signed scales (6 bits, offset 32 removed). Low 4 bits of scale i come from byte
// i % 8 (nibble i / 8), the high 2 bits from byte 8 + i % 4 (bit pair i / 4).
static inline void unpack_scales_q3_k(const uint8_t* s, int8_t* out) {
  for (int i = 0; i < 16; ++i) {
    const int lo = (s[i % 8] >> (4 * (i / 8))) & 0xF;
    const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    out[i] = static_cast<int8_t>((lo | (hi << 4)) - 32);
  }
}

}  // namespace kvtier::cpu
