// Scalar reference dot products (see ref_kernels.h for the accumulation order).
#include <cmath>
#include <cstring>

#include "backend/cpu/block_unpack.h"
#include "backend/cpu/ref_kernels.h"

namespace kvtier::cpu::ref {
namespace {

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

uint16_t load_u16(const uint8_t* p) {
  return load<uint16_t>(p);
}

// q: the 32 weight quants of a legacy block, element order.
void nibbles(const uint8_t* qs, int* q) {
  for (int i = 0; i < kQK / 2; ++i) {
    q[i] = qs[i] & 0xF;
    q[i + kQK / 2] = qs[i] >> 4;
  }
}

void fifth_bits(const uint8_t* qh, int* q) {
  const uint32_t h = load<uint32_t>(qh);
  for (int i = 0; i < kQK; ++i) q[i] |= static_cast<int>(((h >> i) & 1u) << 4);
}

int dot32(const int* q, const int8_t* a) {
  int s = 0;
  for (int i = 0; i < kQK; ++i) s += q[i] * a[i];
  return s;
}

}  // namespace

float dot_f32(const uint8_t* w, const uint8_t* act, int64_t k) {
  float s = 0.0f;
  for (int64_t i = 0; i < k; ++i) s += load<float>(w + 4 * i) * load<float>(act + 4 * i);
  return s;
}

float dot_f16(const uint8_t* w, const uint8_t* act, int64_t k) {
  float s = 0.0f;
  for (int64_t i = 0; i < k; ++i) s += unpack_f16(load_u16(w + 2 * i)) * load<float>(act + 4 * i);
  return s;
}

float dot_bf16(const uint8_t* w, const uint8_t* act, int64_t k) {
  float s = 0.0f;
  for (int64_t i = 0; i < k; ++i) s += unpack_bf16(load_u16(w + 2 * i)) * load<float>(act + 4 * i);
  return s;
}

// Legacy types: sum over blocks of (dw * da) * isum [+ mw * dsum, dsum = da * asum (blocks.h)].
float dot_q4_0(const uint8_t* w, const uint8_t* act, int64_t k) {
  float s = 0.0f;
  for (int64_t b = 0; b < k / kQK; ++b) {
    const auto x = load<BlockQ4_0>(w + b * sizeof(BlockQ4_0));
    const auto a = load<ActQ8_32>(act + b * sizeof(ActQ8_32));
    int q[kQK];
    nibbles(x.qs, q);
    for (int& v : q) v -= 8;
    s += (unpack_f16(x.d) * a.d) * static_cast<float>(dot32(q, a.qs));
  }
  return s;
}

float dot_q4_1(const uint8_t* w, const uint8_t* act, int64_t k) {
  float s = 0.0f;
  for (int64_t b = 0; b < k / kQK; ++b) {
    const auto x = load<BlockQ4_1>(w + b * sizeof(BlockQ4_1));
    const auto a = load<ActQ8_32>(act + b * sizeof(ActQ8_32));
    int q[kQK];
    nibbles(x.qs, q);
    s += (unpack_f16(x.d) * a.d) * static_cast<float>(dot32(q, a.qs));
    s = std::fma(unpack_f16(x.m), a.dsum, s);
  }
  return s;
}

float dot_q5_0(const uint8_t* w, const uint8_t* act, int64_t k) {
  float s = 0.0f;
  for (int64_t b = 0; b < k / kQK; ++b) {
    const auto x = load<BlockQ5_0>(w + b * sizeof(BlockQ5_0));
    const auto a = load<ActQ8_32>(act + b * sizeof(ActQ8_32));
    int q[kQK];
    nibbles(x.qs, q);
    fifth_bits(x.qh, q);
    for (int& v : q) v -= 16;
    s += (unpack_f16(x.d) * a.d) * static_cast<float>(dot32(q, a.qs));
  }
  return s;
}

float dot_q5_1(const uint8_t* w, const uint8_t* act, int64_t k) {
  float s = 0.0f;
  for (int64_t b = 0; b < k / kQK; ++b) {
    const auto x = load<BlockQ5_1>(w + b * sizeof(BlockQ5_1));
    const auto a = load<ActQ8_32>(act + b * sizeof(ActQ8_32));
    int q[kQK];
    nibbles(x.qs, q);
    fifth_bits(x.qh, q);
    s += (unpack_f16(x.d) * a.d) * static_cast<float>(dot32(q, a.qs));
    s = std::fma(unpack_f16(x.m), a.dsum, s);
  }
  return s;
}

float dot_q8_0(const uint8_t* w, const uint8_t* act, int64_t k) {
  float s = 0.0f;
  for (int64_t b = 0; b < k / kQK; ++b) {
    const auto x = load<BlockQ8_0>(w + b * sizeof(BlockQ8_0));
    const auto a = load<ActQ8_32>(act + b * sizeof(ActQ8_32));
    int q[kQK];
    for (int i = 0; i < kQK; ++i) q[i] = x.qs[i];
    s += (unpack_f16(x.d) * a.d) * static_cast<float>(dot32(q, a.qs));
  }
  return s;
}

// K-quants: per super-block, isum = sum_j scale_j * (sum over sub-block j of q * a) and
// msum = sum_j min_j * (sum of a over sub-block j); s += (d * da) * isum - (dmin * da) * msum.
// The SIMD paths compute the same integers and the same float expression.
float dot_q2_k(const uint8_t* w, const uint8_t* act, int64_t k) {
  float s = 0.0f;
  for (int64_t b = 0; b < k / kQKK; ++b) {
    const auto x = load<BlockQ2_K>(w + b * sizeof(BlockQ2_K));
    const auto a = load<ActQ8_K>(act + b * sizeof(ActQ8_K));
    int isum = 0, msum = 0;
    for (int j = 0; j < 16; ++j) {
      int sub = 0;
      for (int e = 16 * j; e < 16 * j + 16; ++e) {
        const int q = (x.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        sub += q * a.qs[e];
      }
      isum += (x.scales[j] & 0xF) * sub;
      msum += (x.scales[j] >> 4) * a.bsums[j];
    }
    s += (unpack_f16(x.d) * a.d) * static_cast<float>(isum) -
         (unpack_f16(x.dmin) * a.d) * static_cast<float>(msum);
  }
  return s;
}

float dot_q3_k(const uint8_t* w, const uint8_t* act, int64_t k) {
  float s = 0.0f;
  for (int64_t b = 0; b < k / kQKK; ++b) {
    const auto x = load<BlockQ3_K>(w + b * sizeof(BlockQ3_K));
    const auto a = load<ActQ8_K>(act + b * sizeof(ActQ8_K));
    int8_t sc[16];
    unpack_scales_q3_k(x.scales, sc);
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      int sub = 0;
      for (int e = 16 * j; e < 16 * j + 16; ++e) {
        const int lo = (x.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        const int hi = (x.hmask[e % 32] >> (e / 32)) & 1;
        sub += (lo - (hi ? 0 : 4)) * a.qs[e];
      }
      isum += sc[j] * sub;
    }
    s += (unpack_f16(x.d) * a.d) * static_cast<float>(isum);
  }
  return s;
}

template <bool kFifthBit, typename Block>
float dot_q45_k(const uint8_t* w, const uint8_t* act, int64_t k) {
  float s = 0.0f;
  for (int64_t b = 0; b < k / kQKK; ++b) {
    const auto x = load<Block>(w + b * sizeof(Block));
    const auto a = load<ActQ8_K>(act + b * sizeof(ActQ8_K));
    int isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, mn;
      unpack_scale_min_k4(x.scales, j, &sc, &mn);
      int sub = 0;
      for (int l = 0; l < 32; ++l) {
        int q = (x.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF;
        if constexpr (kFifthBit) q |= ((x.qh[l] >> j) & 1) << 4;
        sub += q * a.qs[32 * j + l];
      }
      isum += sc * sub;
      msum += mn * (a.bsums[2 * j] + a.bsums[2 * j + 1]);
    }
    s += (unpack_f16(x.d) * a.d) * static_cast<float>(isum) -
         (unpack_f16(x.dmin) * a.d) * static_cast<float>(msum);
  }
  return s;
}

float dot_q4_k(const uint8_t* w, const uint8_t* act, int64_t k) {
  return dot_q45_k<false, BlockQ4_K>(w, act, k);
}
float dot_q5_k(const uint8_t* w, const uint8_t* act, int64_t k) {
  return dot_q45_k<true, BlockQ5_K>(w, act, k);
}

float dot_q6_k(const uint8_t* w, const uint8_t* act, int64_t k) {
  float s = 0.0f;
  for (int64_t b = 0; b < k / kQKK; ++b) {
    const auto x = load<BlockQ6_K>(w + b * sizeof(BlockQ6_K));
    const auto a = load<ActQ8_K>(act + b * sizeof(ActQ8_K));
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      int sub = 0;
      for (int e = 16 * j; e < 16 * j + 16; ++e) {
        const int h = e / 128, r = e % 128;
        const int lo = (x.ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
        const int hi = (x.qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
        sub += ((lo | (hi << 4)) - 32) * a.qs[e];
      }
      isum += x.scales[j] * sub;
    }
    s += (unpack_f16(x.d) * a.d) * static_cast<float>(isum);
  }
  return s;
}

}  // namespace kvtier::cpu::ref
